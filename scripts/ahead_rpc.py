"""Rounds launched ahead against rounds launched in order, through an `edgespec worker` on this
machine (RPC: llama.cpp's decode returns before the worker is done, as on a GPU), with a caller
that spends ``--caller-ms`` on each chunk (a UI, a socket). One engine, the two orders taken in
turns (``-r`` pairs), greedy ``none``; tokens per second of decoding, prompt excluded.

    .venv/bin/python scripts/ahead_rpc.py [--model PATH] [--caller-ms 0,1,3] [-r 8] [-n 150]

On the GPU the same comparison is ``scripts/host_floor.py --in-order`` (no caller's work: what
overlaps there is edgespec's own per-token work).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rpc_table import _start  # noqa: E402

PROMPT = ("Write a Python function that parses a CSV file and sums a column, with a docstring "
          "and tests.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="target GGUF (default: the default pair's target)")
    ap.add_argument("--caller-ms", default="0,1,3", help="the caller's milliseconds per chunk")
    ap.add_argument("-r", "--repeats", type=int, default=8)
    ap.add_argument("-n", "--tokens", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1, help="the worker's threads")
    args = ap.parse_args()
    from edgespec.core.sampling import SamplingParams
    from edgespec.runtime.engine import Engine

    worker, endpoint = _start([sys.executable, "-m", "edgespec", "worker", "--port", "0",
                               "--threads", str(args.threads)], r" on (127\.0\.0\.1:\d+) ")
    try:
        engine = Engine.load(args.model, rpc=endpoint, drafter="none", n_threads=1,
                             progress=False)
        greedy = SamplingParams(temperature=0)

        def rate(pause: float) -> float:
            last = None
            for last in engine.stream(PROMPT, max_tokens=args.tokens, sampling=greedy):
                if pause:
                    time.sleep(pause)
            s = last.stats
            return s.generated / (s.time_total - s.time_prefill)

        rate(0)  # warm-up
        print(f"{'caller ms':>9} {'ahead tok/s':>12} {'in order':>9} {'ratio':>6}"
              f"   (medians of {args.repeats} pairs; ratio range)")
        for ms in (float(x) for x in args.caller_ms.split(",")):
            got: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for ahead in (True, False):
                    engine.target.asynchronous = ahead
                    got[ahead].append(rate(ms / 1e3))
            ratios = [a / b for a, b in zip(got[True], got[False])]
            print(f"{ms:9g} {statistics.median(got[True]):12.1f} {statistics.median(got[False]):9.1f} "
                  f"{statistics.median(ratios):6.3f}   {min(ratios):.3f}-{max(ratios):.3f}", flush=True)
        engine.close()  # (before the worker goes: freeing a context calls it)
    finally:
        worker.terminate()
        worker.wait(10)


if __name__ == "__main__":
    main()
