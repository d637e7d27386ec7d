"""What a rejected draft costs on a hybrid target: a round of width w whose drafts are all
rejected (the call, then a rollback through llama.cpp's snapshots) against one whose drafts are
all accepted, and against what a rejection cost before snapshots (a re-read of the context).

    .venv/bin/python scripts/hybrid_costs.py [SHAPE ...] [--context 512] [--repeats 20]

SHAPE is an :mod:`edgespec.models.synthetic` preset (random weights of the real architecture:
costs do not depend on the weights). Prints one table per model; median seconds over repeats,
the kinds interleaved so that a slow moment hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edgespec.models import synthetic
from edgespec.runtime.backend import LlamaBackend, ModelOptions


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def measure(shape: str, context: int, repeats: int) -> None:
    path = synthetic.cached(shape)
    be = LlamaBackend(ModelOptions(path=str(path), n_ctx=context + 64))
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 20000, size=context)]
    be.sync([])
    be.decode(prompt, 1)
    width = be.draft_reach + 1
    memory = be.context.recurrent
    times: dict[str, list[float]] = {"step": [], "accepted": [], "rejected": [], "reread": []}
    for _ in range(repeats):
        base = list(be.tokens)
        tokens = [int(t) for t in rng.integers(100, 20000, size=width)]
        # one plain step
        t0 = time.perf_counter()
        be.decode(tokens[:1], 1)
        times["step"].append(time.perf_counter() - t0)
        be.trim(len(base))  # (within reach: the call's one token is not rolled back: re-synced)
        be.sync(base)
        if len(be.tokens) < len(base):
            be.decode(base[len(be.tokens):], 0)
        # a round of `width`, all accepted: the call alone
        t0 = time.perf_counter()
        be.decode(tokens, width)
        times["accepted"].append(time.perf_counter() - t0)
        be.sync(base)
        if len(be.tokens) < len(base):
            be.decode(base[len(be.tokens):], 0)
        # the same round, every draft rejected: the call, then the rollback of width - 1 tokens
        restores, rereads = memory.restores, memory.rereads
        t0 = time.perf_counter()
        be.decode(tokens, width)
        be.trim(len(base) + 1)
        times["rejected"].append(time.perf_counter() - t0)
        assert (memory.restores, memory.rereads) == (restores, rereads), "rolled back past reach"
        # before snapshots: the rejection emptied the cache and the context was read again
        t0 = time.perf_counter()
        be.reset()
        be.decode(base + tokens[:1], 1)
        times["reread"].append(time.perf_counter() - t0)
        be.sync(base)
        if len(be.tokens) < len(base):
            be.decode(base[len(be.tokens):], 0)
    step = _median(times["step"])
    print(f"\n{shape}: context {context} tokens, round width {width} "
          f"(draft reach {be.draft_reach}), median of {repeats}")
    print(f"{'':24s}{'ms':>10s}{'x step':>10s}")
    for name, label in (("step", "plain step"), ("accepted", f"round, all accepted"),
                        ("rejected", f"round, all rejected"), ("reread", "re-read (before)")):
        m = _median(times[name])
        print(f"{label:24s}{m * 1e3:10.2f}{m / step:10.2f}")
    ratio = _median(times["rejected"]) / _median(times["accepted"])
    print(f"rejected / accepted: {ratio:.3f}")
    be.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="*", default=["qwen35-tiny", "lfm2-tiny"])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for shape in args.shapes:
        measure(shape, args.context, args.repeats)


if __name__ == "__main__":
    main()
