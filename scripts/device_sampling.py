"""Probe: sampled rounds sampled by llama.cpp's backend sampler, coupled draw for draw.

For a one-hot draft x (prompt lookup, a plain step), the exact test has a simpler form: draw
y ~ p and accept iff y == x. The acceptance probability is p(x), and a rejected round's y is
distributed as p without x, renormalised, which is the residual. So a sampled round of one-hot
drafts needs one sample per row from the processed distribution, taken where the logits are,
and the greedy verdict on those samples. No row of logits would have to reach the host (600 KB
a row for a 152k vocabulary: a GPU's copy and NumPy pass, or an RPC worker's network).

llama.cpp's ``dist`` sampler, attached to a sequence (``llama_set_sampler``), draws one uniform
per output row. With several outputs a sequence its draws are transactional: a call draws from a
copy of the sampler's stream, and ``llama_sampler_accept`` advances the stream by one draw per
committed token. Drafts that are not committed give their draws back. So if every emitted token
consumes the next draw in order, the text for a seed is the same with or without drafting, as
in greedy decoding.

This script checks, on the real llama.cpp (run here on the CPU, where logits do not depend on
the batch within one call of up to 3 tokens, the engine's exact pieces):

1. Without ``llama_sampler_accept`` the draw repeats: N single-row calls at the same context
   give one token N times.
2. With it, plain device-sampled decoding (one row a call) and rounds that feed drafts (the
   plain text's own tokens, every other round's last draft made wrong) give the same tokens.

It is a probe for building the device path, not part of edgespec: it drives the backend's
internals (``_attach``, ``_decode``).

Usage: python scripts/device_sampling.py [--model GGUF] [-n 24] [--drafts 2] [--seed 42]
       [--temperature 1.2] [--calls 40] [--ngl 0]
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path

import edgespec  # noqa: F401  (llama.cpp's runtime first, as the package arranges)
import llama_cpp

from edgespec.runtime.engine import Engine

PROMPT = "Once upon a time, there"


def attach(backend, temperature: float, seed: int):
    """A chain [temp, dist(seed)] on sequence 0 of ``backend``'s context, in the place of the
    backend's own sampler (its ``_decode(..., "argmax")`` then reads this chain's picks)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
    backend._attach(None)
    if not llama_cpp.llama_set_sampler(backend._ctx.ctx, 0, chain):
        raise SystemExit("this context cannot run a backend sampler")
    backend._chain, backend._attached = chain, "dist"
    return chain


def picks(backend, context: list[int], feed: list[int]) -> list[int]:
    backend.sync(context)
    return [int(x) for x in backend._decode(feed, len(feed), "argmax")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache/edgespec/models/"
                                           "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-n", type=int, default=24, help="tokens to generate")
    ap.add_argument("--drafts", type=int, default=2,
                    help="drafts a round (the CPU's exact pieces take 3 tokens a call: with "
                    "more, a round is two calls and the draws of the second start over)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--temperature", type=float, default=1.2)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--ngl", type=int, default=0, help="layers offloaded to a GPU (-1: all)")
    args = ap.parse_args()
    backend = Engine.load(target=args.model, draft=None, progress=False,
                          n_gpu_layers=args.ngl).target
    prompt = backend.tokenize(PROMPT)

    chain = attach(backend, args.temperature, args.seed)
    backend.reset()
    backend.decode(prompt[:-1], 0)
    seen = collections.Counter(picks(backend, prompt[:-1], prompt[-1:])[0]
                               for _ in range(args.calls))
    print(f"1. {args.calls} calls, no accept: {len(seen)} distinct token(s) {seen.most_common(3)}")
    accepted = collections.Counter()
    for _ in range(args.calls):
        token = picks(backend, prompt[:-1], prompt[-1:])[0]
        accepted[token] += 1
        llama_cpp.llama_sampler_accept(chain, token)
    print(f"   then {args.calls} calls, each accepted: {len(accepted)} distinct token(s) "
          f"{accepted.most_common(3)}")

    chain = attach(backend, args.temperature, args.seed)
    text = list(prompt)
    for _ in range(args.n):
        token = picks(backend, text[:-1], text[-1:])[0]
        llama_cpp.llama_sampler_accept(chain, token)
        text.append(token)
    plain = text[len(prompt):]

    chain = attach(backend, args.temperature, args.seed)
    text, rounds = list(prompt), []
    while len(text) - len(prompt) < args.n:
        done = len(text) - len(prompt)
        drafts = plain[done:done + args.drafts]
        if len(rounds) % 2 and drafts:  # a wrong last draft: the round rejects there
            drafts = drafts[:-1] + [drafts[-1] + 1]
        got = picks(backend, text[:-1], [text[-1], *drafts])
        j = 0
        while j < len(drafts) and drafts[j] == got[j]:
            j += 1
        for token in [*drafts[:j], got[j]]:
            llama_cpp.llama_sampler_accept(chain, token)
            text.append(token)
        rounds.append((len(drafts), j))
    spec = text[len(prompt):][:args.n]
    print(f"2. plain:  {plain}\n   rounds: {spec}\n   (drafted, accepted) by round: {rounds}")
    print(f"   the same tokens: {plain == spec}")


if __name__ == "__main__":
    main()
