"""The README's RPC table: `none` and `auto` tokens per second on the edit prompts, locally and
through an `edgespec worker` on this machine at 0, 2 and 10 ms round trip (scripts/delay_proxy.py
adds the delay), each setting one `edgespec bench` run (so each ratio is against `none` measured in
the same run).

    .venv/bin/python scripts/rpc_table.py [--pair default] [-r 2] [-n 64] [--rtt-ms 0,2,10]

Also prints the RPC cost of one plain step (`none`'s seconds per token through the worker minus
locally) against the round trip.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="default")
    parser.add_argument("-r", "--repeats", type=int, default=2)
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--rtt-ms", default="0,2,10")
    args = parser.parse_args()
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    worker, endpoint = _start([sys.executable, "-m", "edgespec", "worker", "--port", "0"],
                              r" on (\S+:\d+) ")
    procs = [worker]
    rows = []
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
                got = _bench(args, rpc, Path(tmp) / f"b{i}.json")
                rows.append((label, got["none"]["tokens_per_second"], got["auto"]["tokens_per_second"],
                             got["auto"]["ratio_vs_none"]))
                print(f"{label}: none {rows[-1][1]:.1f} tok/s, auto {rows[-1][2]:.1f} tok/s "
                      f"({rows[-1][3]:.2f}x)", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.terminate()
    local_step = 1 / rows[0][1]
    print(f"| setting ({args.pair}, edit prompts) | `none` tok/s | `auto` tok/s | auto / none "
          "| RPC cost of a plain step |")
    print("|---|---|---|---|---|")
    for label, none_tps, auto_tps, ratio in rows:
        extra = "-" if label == "local" else f"{(1 / none_tps - local_step) * 1000:.1f} ms"
        print(f"| {label} | {none_tps:.1f} | {auto_tps:.1f} | {ratio:.2f}x | {extra} |")


if __name__ == "__main__":
    main()
