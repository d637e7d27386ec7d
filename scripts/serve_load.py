#!/usr/bin/env python3
"""Bounded load test of a running ``edgespec serve``: N concurrent clients, a fixed number of
requests, every one with a timeout.

    .venv/bin/edgespec serve --pair tiny --max-queue 4 &
    .venv/bin/python scripts/serve_load.py --url http://127.0.0.1:8080 --clients 8 --requests 32

Prints requests, completed, rejected (503: the queue was full, expected when clients outnumber
the queue; not retried, the client waits --backoff seconds), failures (anything else, timeouts
included), p50/p95 latency of the completed requests, and the server's resident memory before
and after (from ``GET /metrics?format=json``). Exit status 1 if any request failed.
``tests/test_serve_real.py`` runs the same test in-process.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class LoadReport:
    """What a load run measured. Latencies are seconds, memory is bytes."""

    requests: int = 0
    completed: int = 0
    rejected: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_seconds: float = 0.0
    rss_before: int = 0
    rss_after: int = 0

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100) of completed-request latency (nearest rank)."""
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    def lines(self) -> list[str]:
        mib = 1024 * 1024
        return [
            f"requests   {self.requests} in {self.wall_seconds:.2f}s: {self.completed} completed, "
            f"{self.rejected} rejected (503), {len(self.failures)} failed",
            f"latency    p50 {self.percentile(50) * 1000:.0f} ms, p95 {self.percentile(95) * 1000:.0f} ms"
            f" (mean {statistics.fmean(self.latencies) * 1000 if self.latencies else float('nan'):.0f} ms)",
            f"tokens     {self.tokens} generated",
            f"memory     RSS {self.rss_before / mib:.1f} MiB before, {self.rss_after / mib:.1f} MiB after "
            f"({(self.rss_after - self.rss_before) / mib:+.1f} MiB)",
            *(f"failure    {f}" for f in self.failures[:10]),
        ]


def server_rss(http: httpx.Client) -> int:
    """The server's resident memory in bytes, from its metrics."""
    res = http.get("/metrics", params={"format": "json"})
    res.raise_for_status()
    return int(res.json()["resident_memory_bytes"])


def run_load(url: str, *, clients: int = 8, requests: int = 32, max_tokens: int = 8,
             chat: bool = True, stream: bool = False, api_key: str | None = None,
             timeout: float = 60.0, backoff: float = 0.1, warmup: bool = True) -> LoadReport:
    """Send ``requests`` requests from ``clients`` threads to the server at ``url`` (without
    ``/v1``) and measure them. A request that gets a 503 is not retried; its client waits
    ``backoff`` seconds before its next one. One warm-up request runs first, so that first-use
    allocations do not count as growth."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = LoadReport(requests=requests)
    lock = threading.Lock()
    next_index = iter(range(requests))
    path = "/v1/chat/completions" if chat else "/v1/completions"

    def body(i: int) -> dict:
        prompt = f"Request {i}: name a colour."
        content = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        return {"model": "any", "max_tokens": max_tokens, "stream": stream, **content}

    def one(http: httpx.Client, i: int) -> bool:
        """One request; False if it was rejected with a 503."""
        start = time.perf_counter()
        try:
            if stream:
                with http.stream("POST", path, json=body(i)) as res:
                    if res.status_code == 200:
                        lines = [line for line in res.iter_lines() if line]
                    else:
                        lines = []
                        res.read()
                ok = res.status_code == 200 and lines[-1:] == ["data: [DONE]"]
                tokens = 0
            else:
                res = http.post(path, json=body(i))
                ok = res.status_code == 200
                tokens = res.json()["usage"]["completion_tokens"] if ok else 0
        except httpx.HTTPError as err:
            with lock:
                report.failures.append(f"request {i}: {type(err).__name__}: {err}")
            return True
        elapsed = time.perf_counter() - start
        with lock:
            if ok:
                report.completed += 1
                report.latencies.append(elapsed)
                report.tokens += tokens
            elif res.status_code == 503:
                report.rejected += 1
                return False
            else:
                report.failures.append(f"request {i}: HTTP {res.status_code}: {res.text[:200]}")
        return True

    def client_loop() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=timeout) as http:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                if not one(http, i):
                    time.sleep(backoff)

    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as http:
        if warmup:
            http.post(path, json=body(-1)).raise_for_status()
        report.rss_before = server_rss(http)
        start = time.perf_counter()
        threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        deadline = start + timeout * (requests + 1)
        for t in threads:
            t.join(max(0.0, deadline - time.perf_counter()))
        report.wall_seconds = time.perf_counter() - start
        hung = sum(t.is_alive() for t in threads)
        if hung:
            report.failures.append(f"{hung} client threads still running at the deadline")
        report.rss_after = server_rss(http)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="server address, without /v1")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--completions", action="store_true", help="/v1/completions instead of chat")
    ap.add_argument("--stream", action="store_true", help="streamed responses")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    ap.add_argument("--backoff", type=float, default=0.1,
                    help="seconds a client waits after a 503 before its next request")
    args = ap.parse_args(argv)
    try:
        report = run_load(args.url, clients=args.clients, requests=args.requests,
                          max_tokens=args.max_tokens, chat=not args.completions, stream=args.stream,
                          api_key=args.api_key, timeout=args.timeout, backoff=args.backoff)
    except httpx.HTTPError as err:
        print(f"error: cannot reach {args.url}: {err}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
