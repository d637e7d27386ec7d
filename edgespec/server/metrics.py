"""Counters behind ``GET /metrics``: requests, tokens, queue, acceptance, speedup, memory.

The speedup is each generation's own (``Stats.speedup``: target-only decoding estimated from its
own target calls, at the same moment), summed as seconds: target-only seconds over decoding
seconds of every generation that has a figure, the speedup of all those tokens together.

Updated from the event loop (requests) and the worker thread (generations), so every update
takes a lock. :meth:`Metrics.snapshot` gives a JSON-ready dict; :func:`prometheus_text` renders
the same numbers in the Prometheus text format.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections import Counter
from typing import Any, Sequence

from ..core.speedup import CURVE, MEASURED
from ..core.stats import Stats

SPEEDUP_BASES = (MEASURED, CURVE)


def resident_memory_bytes() -> int:
    """This process's resident set size now (Linux), else its peak (other systems)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class Metrics:
    """Thread-safe running totals for the server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()
        self._generations: Counter[str] = Counter()
        self._tokens: Counter[str] = Counter()
        self._seconds = 0.0
        self._mean_job_seconds = 0.0
        self._target_only_seconds = 0.0
        self._decode_seconds = 0.0
        self._speedup_bases: Counter[str] = Counter()

    def count_request(self, endpoint: str, status: int) -> None:
        """One HTTP response on ``endpoint`` with ``status``."""
        with self._lock:
            self._requests[(endpoint, status)] += 1

    def count_generation(self, outcome: str, stats: Stats | Sequence[Stats] | None,
                         seconds: float) -> None:
        """One finished job: ``outcome`` is ``completed``, ``cancelled`` or ``failed``;
        ``stats``: its generation's, or each of its choices'."""
        each = [] if stats is None else [stats] if isinstance(stats, Stats) else list(stats)
        with self._lock:
            self._generations[outcome] += 1
            self._seconds += seconds
            # an exponential average of job time: the basis of Retry-After
            self._mean_job_seconds += 0.2 * (seconds - self._mean_job_seconds)
            for one in each:
                self._tokens["prompt"] += one.prompt_tokens
                self._tokens["generated"] += one.generated
                self._tokens["drafted"] += one.drafted
                self._tokens["accepted"] += one.accepted
                self._tokens["rounds"] += one.rounds
                speedup = one.speedup
                if speedup is not None:
                    self._target_only_seconds += speedup.target_only_seconds
                    self._decode_seconds += speedup.seconds
                    self._speedup_bases[speedup.basis] += 1

    @property
    def mean_job_seconds(self) -> float:
        with self._lock:
            return self._mean_job_seconds

    def snapshot(self, *, queue_depth: int, queue_capacity: int, busy: bool) -> dict[str, Any]:
        """Everything, JSON-ready (``GET /metrics?format=json``)."""
        with self._lock:
            by_endpoint: dict[str, dict[str, int]] = {}
            for (endpoint, status), n in sorted(self._requests.items()):
                by_endpoint.setdefault(endpoint, {})[str(status)] = n
            tokens = dict(self._tokens)
            drafted, accepted, rounds = (tokens.get(k, 0) for k in ("drafted", "accepted", "rounds"))
            return {
                "requests": {
                    "total": sum(self._requests.values()),
                    "rejected": sum(n for (_, s), n in self._requests.items() if s == 503),
                    "by_endpoint": by_endpoint,
                },
                "generations": {k: self._generations.get(k, 0)
                                for k in ("completed", "cancelled", "failed")},
                "tokens": {
                    "prompt": tokens.get("prompt", 0),
                    "generated": tokens.get("generated", 0),
                    "drafted": drafted,
                    "accepted": accepted,
                },
                "rounds": rounds,
                "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
                "mean_accepted": round(accepted / rounds, 4) if rounds else 0.0,
                "generation_seconds": round(self._seconds, 3),
                "speedup": {
                    "ratio": (round(self._target_only_seconds / self._decode_seconds, 4)
                              if self._decode_seconds > 0 else None),
                    "target_only_seconds": round(self._target_only_seconds, 4),
                    "decode_seconds": round(self._decode_seconds, 4),
                    "generations": {b: self._speedup_bases.get(b, 0) for b in SPEEDUP_BASES},
                },
                "queue_depth": queue_depth,
                "queue_capacity": queue_capacity,
                "busy": busy,
                "resident_memory_bytes": resident_memory_bytes(),
            }


def prometheus_text(snap: dict[str, Any]) -> str:
    """The Prometheus text exposition format (version 0.0.4) of a :meth:`Metrics.snapshot`."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    metric("edgespec_requests_total", "counter", "HTTP responses by endpoint and status.",
           [(f'{{endpoint="{e}",status="{s}"}}', n)
            for e, statuses in snap["requests"]["by_endpoint"].items() for s, n in statuses.items()])
    metric("edgespec_generations_total", "counter", "Generations by outcome.",
           [(f'{{outcome="{k}"}}', n) for k, n in snap["generations"].items()])
    metric("edgespec_tokens_total", "counter", "Tokens: prompt, generated, drafted, accepted.",
           [(f'{{kind="{k}"}}', n) for k, n in snap["tokens"].items()])
    metric("edgespec_rounds_total", "counter", "Verification rounds (target calls).",
           [("", snap["rounds"])])
    metric("edgespec_acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
           [("", snap["acceptance_rate"])])
    metric("edgespec_mean_accepted", "gauge", "Accepted draft tokens per round since start.",
           [("", snap["mean_accepted"])])
    metric("edgespec_generation_seconds_total", "counter", "Wall time spent generating.",
           [("", snap["generation_seconds"])])
    speedup = snap["speedup"]
    metric("edgespec_speedup", "gauge",
           "Target-only seconds over decoding seconds of the generations with a same-moment "
           "speedup, since start (NaN before one).",
           [("", speedup["ratio"] if speedup["ratio"] is not None else "NaN")])
    metric("edgespec_target_only_seconds_total", "counter",
           "Seconds target-only decoding would have taken, estimated in each generation.",
           [("", speedup["target_only_seconds"])])
    metric("edgespec_decode_seconds_total", "counter",
           "Decoding seconds (prefill excluded) of the generations with a speedup.",
           [("", speedup["decode_seconds"])])
    metric("edgespec_speedup_generations_total", "counter",
           "Generations with a speedup, by how its baseline was obtained.",
           [(f'{{basis="{b}"}}', n) for b, n in speedup["generations"].items()])
    metric("edgespec_queue_depth", "gauge", "Requests waiting for the engine.",
           [("", snap["queue_depth"])])
    metric("edgespec_queue_capacity", "gauge", "Most requests that may wait.",
           [("", snap["queue_capacity"])])
    metric("edgespec_busy", "gauge", "1 while a generation runs.", [("", int(snap["busy"]))])
    metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
           [("", snap["resident_memory_bytes"])])
    return "\n".join(lines) + "\n"
