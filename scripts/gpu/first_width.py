"""What the first call of a width costs on this device, and what the engine's warm-up saves.

In the H200 lease of 2026-11-27 an answer's llama.cpp time ran ~40-50 ms over its calls'
usual costs for each call width the calibration had not run before in that process (the
first bench prompt's ``auto``: 2 such widths, +96 ms; its second repeat, 1, +40 ms). This
times, on one loaded target, after a 64-token context:

1. widths never called before in this process: their first call, then three more of the same
   width in a row (the second captures a CUDA graph, the later ones replay it);
2. ``Engine._warm`` over widths 1 .. 33, as calibration does on a GPU (its wall time);
3. widths the warm-up ran, called again among other widths: what remains of a first call;
4. the same widths after a longer context (700 and 1,400 cached tokens), first there and
   then again: whether a first call's cost comes back as the cache grows (kernels chosen by
   the cache's length too), which a warm-up at one short context would not cover.

Usage: python scripts/gpu/first_width.py TARGET_GGUF [--ngl -1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import edgespec  # noqa: F401  (llama.cpp's runtime first, as the package arranges)

from edgespec.runtime.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("--ngl", type=int, default=-1)
    args = ap.parse_args()
    engine = Engine.load(target=args.target, draft=None, drafter="none", progress=False,
                         n_gpu_layers=args.ngl)
    be = engine.target
    prefix = [(300 + i) % be.n_vocab for i in range(64)]

    def call(n: int, context: list[int] = prefix) -> float:
        be.sync(context)
        if len(be.tokens) < len(context):
            be.decode(context[len(be.tokens):], 0)
        batch = [(1000 + i) % be.n_vocab for i in range(n)]
        t0 = time.perf_counter()
        be.decode(batch, n)
        return (time.perf_counter() - t0) * 1e3

    for _ in range(4):
        call(1)
    print(f"graph_shapes: {getattr(be, 'graph_shapes', False)}; a plain step repeated: "
          f"{statistics.median(call(1) for _ in range(5)):.2f} ms")
    print("\n1. widths not called before: ms of the 1st, 2nd, 3rd, 4th call in a row")
    for n in (5, 7, 13, 23, 29):
        print(f"   width {n:2d}: " + "  ".join(f"{call(n):7.2f}" for _ in range(4)))
    t0 = time.perf_counter()
    engine._warm(33, draft=False)
    print(f"\n2. the engine's warm-up, widths 1-33: {time.perf_counter() - t0:.3f} s")
    print("\n3. widths the warm-up ran, each after a plain step: ms of its 1st call since")
    for n in (6, 11, 19, 27, 33):
        call(1)
        print(f"   width {n:2d}: {call(n):7.2f}")
    for length in (700, 1400):
        if length + 40 > be.n_ctx:
            break
        longer = [(300 + i) % be.n_vocab for i in range(length)]
        call(1, longer)
        print(f"\n4. after {length} cached tokens: ms of a width's 1st call there, then its 2nd, "
              "each after a plain step")
        for n in (1, 5, 11, 19, 27, 33):
            first = call(n, longer)
            call(1, longer)
            print(f"   width {n:2d}: {first:7.2f}  {call(n, longer):7.2f}")
    engine.close()


if __name__ == "__main__":
    main()
