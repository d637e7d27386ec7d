"""Acceptance and speed of each drafter on two prompts (a copy-heavy edit, free generation).

A stopgap until `edgespec bench`: runs each configuration `--repeats` times, interleaved
(none, model, lookup, hybrid, none, ...), greedy, on the default pair, and prints medians.
Usage: python scripts/drafter_table.py [--tokens 256] [--repeats 2] [-k 4]
"""
import argparse
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edgespec import Engine, SamplingParams  # noqa: E402
from tests.test_real_default_pair import PROMPTS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", type=int, default=256)
ap.add_argument("--repeats", type=int, default=2)
ap.add_argument("-k", type=int, default=4)
a = ap.parse_args()

drafters = ("none", "model", "lookup", "hybrid")
results: dict = {}
with Engine.load(pair="default", drafter="hybrid", progress=False) as engine:
    engine.complete("warm up", max_tokens=8)
    for r in range(a.repeats):
        for prompt in ("edit", "free"):
            for d in drafters:
                out = engine.complete(PROMPTS[prompt], max_tokens=a.tokens, drafter=d, draft_length=a.k,
                                      sampling=SamplingParams(temperature=0))
                results.setdefault((prompt, d), []).append(out)

print(f"{'prompt':6} {'drafter':8} {'tokens':>6} {'tok/s':>7} {'x none':>7} {'accept':>7} {'tok/round':>9}")
for prompt in ("edit", "free"):
    base = statistics.median(o.stats.tokens_per_second for o in results[(prompt, "none")])
    for d in drafters:
        runs = results[(prompt, d)]
        tps = statistics.median(o.stats.tokens_per_second for o in runs)
        s = runs[-1].stats
        print(f"{prompt:6} {d:8} {s.generated:6d} {tps:7.1f} {tps / base:7.2f} "
              f"{100 * s.acceptance_rate:6.0f}% {s.tokens_per_round:9.2f}")
print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
