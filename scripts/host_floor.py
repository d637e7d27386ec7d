"""Host time per token outside llama.cpp: edgespec's greedy ``none`` against a bare loop.

Both run the same model, context and llama.cpp calls (the batch, ``llama_decode``,
``llama_synchronize``, the backend sampler's pick): the bare loop does nothing else, so its
time outside those calls is the floor a Python caller of llama.cpp pays, and edgespec's
excess over it is edgespec's own per-token work (loop, backend, streaming). A GPU token of
the default target costs ~2 ms, so tens of microseconds here are percents there.

Python runs cold after a decode (its code and data were evicted), so this is measured
between real decodes: a warm loop on a synthetic model (``edgespec bench --overhead``)
costs several times less than the same code here.

``--base REF`` also runs commit REF's edgespec (copied out as ``edgespec_base``, as
``scripts/overhead_ab.py`` does; REF may be a directory holding an ``edgespec`` package) in the
same process, alternating with this checkout's: on a shared VM separate runs drift more than
most changes move.

Where decodes are asynchronous (a GPU, RPC workers) edgespec's work after a round overlaps the
next round's decode: read the wall time's excess over the bare loop there, not the time
outside llama.cpp (which counts the overlapped work too).

``--draft PATH`` loads a draft model too, for ``--drafter auto`` as a GPU runs it: there the
draft model can pay, so auto rates it every round (a plain step then makes a choice).

Usage: python scripts/host_floor.py [--model PATH] [--draft PATH] [--ngl N] [-n 179] [-r 5]
       [--base REF] [--drafter none] [--in-order]
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import edgespec  # noqa: F401  (llama.cpp's runtime first, as the package arranges)
import llama_cpp

from edgespec.core.sampling import SamplingParams
from edgespec.runtime.engine import Engine
from edgespec.runtime.loop import prefill

PROMPT = "Write a Python function that parses a CSV file and sums a column."


def edgespec_outside(engine: Engine, n: int, drafter: str = "none") -> tuple[float, float, float]:
    """(µs outside llama.cpp, ms inside it, µs of wall time) per token of a greedy stream."""
    last = None
    for last in engine.stream(PROMPT, max_tokens=n, sampling=SamplingParams(temperature=0.0),
                              drafter=drafter):
        pass
    s = last.stats
    decoding = s.time_total - s.time_prefill
    return ((decoding - s.time_llama) / s.generated * 1e6, s.time_llama / s.generated * 1e3,
            decoding / s.generated * 1e6)


def bare_outside(engine: Engine, n: int) -> tuple[float, float, float]:
    """The same per token for a loop of the bare llama.cpp calls on the same backend."""
    be = engine.target
    tokens = engine.prompt_tokens(PROMPT, chat=True)
    prefill(be, tokens)
    token = be.decode_argmax(tokens[-1:], 1)[0]  # (attaches the backend sampler)
    ctx, batch = be._ctx.ctx, be._batch
    pos = len(be.tokens)
    batch.logits[0] = 1
    inside = 0.0
    start = time.perf_counter()
    for i in range(n):
        batch.token[0] = token
        batch.pos[0] = pos + i
        batch.n_tokens = 1
        t0 = time.perf_counter()
        llama_cpp.llama_decode(ctx, batch)
        llama_cpp.llama_synchronize(ctx)
        inside += time.perf_counter() - t0
        token = llama_cpp.llama_get_sampled_token_ith(ctx, 0)
    total = time.perf_counter() - start
    be.reset()  # (the backend's record of the cache is stale now)
    return (total - inside) / n * 1e6, inside / n * 1e3, total / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target GGUF (default: the default pair's target)")
    ap.add_argument("--draft", help="draft GGUF, loaded for auto (default: none)")
    ap.add_argument("--ngl", type=int, default=None, help="layers on the GPU (-1: all)")
    ap.add_argument("-n", "--tokens", type=int, default=179)
    ap.add_argument("-r", "--repeats", type=int, default=5)
    ap.add_argument("--base", metavar="REF", help="also run this commit's edgespec (or the "
                    "edgespec package in this directory), alternating")
    ap.add_argument("--drafter", default="none", help="edgespec's drafter (default none; the "
                    "bare loop is always plain decoding: compare drafters by their own rows)")
    ap.add_argument("--in-order", action="store_true", help="also run edgespec launching each "
                    "round after the last is yielded, as on the CPU (the same engine, alternating)")
    args = ap.parse_args()
    load = dict(drafter="none", n_gpu_layers=args.ngl, draft_n_gpu_layers=args.ngl,
                progress=False)
    engines = {"edgespec": Engine.load(args.model, args.draft, **load)}
    if args.base:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from overhead_ab import copy_base

        tmp = tempfile.TemporaryDirectory(prefix="host_floor_")  # (removed when main returns)
        copy_base(args.base, Path(tmp.name))
        sys.path.insert(0, tmp.name)
        base = importlib.import_module("edgespec_base.runtime.engine").Engine
        engines[f"base {args.base}"] = base.load(args.model, args.draft, **load)
    for engine in engines.values():
        edgespec_outside(engine, 8, args.drafter)  # warm-up
    mine = engines["edgespec"].target
    names = [*engines, *(["in order"] if args.in_order else []), "bare loop"]
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            rows[name].append(edgespec_outside(engine, args.tokens, args.drafter))
        if args.in_order:
            ahead, mine.asynchronous = mine.asynchronous, False
            rows["in order"].append(edgespec_outside(engines["edgespec"], args.tokens, args.drafter))
            mine.asynchronous = ahead
        rows["bare loop"].append(bare_outside(engines["edgespec"], args.tokens))
    print(f"{'':16} {'outside µs/token':>17} {'llama ms/token':>15} {'wall µs/token':>14}"
          f"   (median of {args.repeats})")
    for name, got in rows.items():
        print(f"{name:16} {statistics.median(r[0] for r in got):17.1f} "
              f"{statistics.median(r[1] for r in got):15.2f} "
              f"{statistics.median(r[2] for r in got):14.1f}")
    bare = rows["bare loop"]
    for name in names[:-1]:
        excess = statistics.median(a[0] - b[0] for a, b in zip(rows[name], bare))
        wall = statistics.median(a[2] - b[2] for a, b in zip(rows[name], bare))
        print(f"{name}: {excess:.1f} µs/token of its own over the bare loop; wall time "
              f"{wall:+.1f} µs/token")
    # Where decodes are asynchronous (a GPU, RPC), edgespec launches the next round before it
    # yields this one: its own time then partly runs while the device computes, and only the
    # wall time's excess says what a token costs it (on the CPU the two agree, within noise).


if __name__ == "__main__":
    main()
