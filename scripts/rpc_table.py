"""The RPC table (docs/rpc.md): `none` and `auto` tokens per second on the edit prompts, locally and
through an `edgespec worker` on this machine at 0, 2 and 10 ms round trip (scripts/delay_proxy.py
adds the delay), each setting one `edgespec bench` run (so each ratio is against `none` measured in
the same run).

    .venv/bin/python scripts/rpc_table.py [--pair default] [-r 2] [-n 64] [--rtt-ms 0,2,10]

The RPC cost of one plain step is measured on its own, in one process: the same one-token
decode, locally and through each setting, taken in turns (``--steps`` of each; medians), so
that the machine's drift cancels out instead of landing in a difference of two bench runs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _start(cmd: list[str], pattern: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.search(pattern, line)
    if not m:
        proc.kill()
        sys.exit(f"could not start {cmd[:3]}: {line!r}")
    return proc, m.group(1)


def _bench(args, rpc: str | None, out: Path) -> dict:
    cmd = [sys.executable, "-m", "edgespec", "bench", "--pair", args.pair, "--drafters", "none,auto",
           "--kinds", "edit", "-r", str(args.repeats), "-n", str(args.max_tokens), "--json", str(out),
           "--plot", str(out.with_suffix(".png"))]
    if rpc:
        cmd += ["--rpc", rpc]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    doc = json.loads(out.read_text())
    return {o["config"]: o for o in doc["aggregates"]["overall"]}


def _step_pair(pair: str, endpoint: str, steps: int) -> tuple[float, float]:
    """Median seconds of one plain decode step (one token, 63 cached), locally and through
    ``endpoint``, taken in turns. (A worker serves one client at a time: one setting per
    process.)"""
    sys.path.insert(0, str(ROOT))
    from edgespec.runtime.engine import Engine
    from edgespec.runtime.loop import prefill

    engines = [Engine.load(pair=pair, drafter="none", rpc=ep, n_ctx=256, progress=False)
               for ep in (None, endpoint)]
    prompt = engines[0].target.tokenize("def parse(path):\n    with open(path) as f:\n" * 6)[:64]
    times: list[list[float]] = [[], []]
    for _ in range(steps):
        for engine, got in zip(engines, times):
            prefill(engine.target, prompt)  # back to 63 cached
            t = time.perf_counter()
            engine.target.decode([prompt[-1]], 1)
            got.append(time.perf_counter() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def _step_costs(args, endpoint: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, __file__, "--pair", args.pair, "--steps", str(args.steps),
                          "--step-child", endpoint], check=True, capture_output=True, text=True)
    local, remote = json.loads(out.stdout.strip().splitlines()[-1])
    return local, remote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="default")
    parser.add_argument("-r", "--repeats", type=int, default=2)
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--rtt-ms", default="0,2,10")
    parser.add_argument("--steps", type=int, default=30, help="plain steps timed per setting")
    parser.add_argument("--steps-only", action="store_true", help="skip the bench runs")
    parser.add_argument("--step-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step_child:
        print(json.dumps(_step_pair(args.pair, args.step_child, args.steps)))
        return
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    worker, endpoint = _start([sys.executable, "-m", "edgespec", "worker", "--port", "0"],
                              r" on (\S+:\d+) ")
    procs = [worker]
    rows = []
    steps: dict[str, tuple[float, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            settings: list[tuple[str, str | None]] = [("local", None)]
            for rtt in rtts:
                if rtt == 0:
                    settings.append(("worker, 0 ms", endpoint))
                    continue
                proxy, listen = _start([sys.executable, str(ROOT / "scripts" / "delay_proxy.py"),
                                        "--to", endpoint, "--delay-ms", str(rtt / 2)],
                                       r"ready on (\S+:\d+)")
                procs.append(proxy)
                settings.append((f"worker, {rtt:g} ms", listen))
            for i, (label, rpc) in enumerate(settings):
                if rpc is not None:
                    steps[label] = _step_costs(args, rpc)
                    print(f"{label}: a plain step {steps[label][1] * 1000:.1f} ms, locally "
                          f"{steps[label][0] * 1000:.1f} ms", file=sys.stderr, flush=True)
                if args.steps_only:
                    rows.append((label, float("nan"), float("nan"), float("nan")))
                    continue
                got = _bench(args, rpc, Path(tmp) / f"b{i}.json")
                rows.append((label, got["none"]["tokens_per_second"], got["auto"]["tokens_per_second"],
                             got["auto"]["ratio_vs_none"]))
                print(f"{label}: none {rows[-1][1]:.1f} tok/s, auto {rows[-1][2]:.1f} tok/s "
                      f"({rows[-1][3]:.2f}x)", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.terminate()
    print(f"| setting ({args.pair}, edit prompts) | `none` tok/s | `auto` tok/s | auto / none "
          "| plain step: here / through the worker | RPC cost of a plain step |")
    print("|---|---|---|---|---|---|")
    for label, none_tps, auto_tps, ratio in rows:
        step = "-" if label not in steps else \
            f"{steps[label][0] * 1000:.1f} / {steps[label][1] * 1000:.1f} ms"
        cost = "-" if label not in steps else f"{(steps[label][1] - steps[label][0]) * 1000:.1f} ms"
        print(f"| {label} | {none_tps:.1f} | {auto_tps:.1f} | {ratio:.2f}x | {step} | {cost} |")


if __name__ == "__main__":
    main()
