"""``auto`` against ``none`` and against variants of its policy, on one loaded engine.

On a lent GPU the models load once per lease and a 128-token run takes a fraction of a second,
so "where does ``auto`` lose against plain decoding, and which part of its policy costs it" is
cheap to answer in the same process: every configuration runs on every bench prompt,
interleaved (order rotated each repeat). Each variant is a :class:`PolicyConfig
<edgespec.core.policy.PolicyConfig>` that changes one thing (or no draft model):

- ``auto``: as shipped;
- ``auto-lookup``: no draft model;
- ``auto-noguard``: no check of what each source delivered (``guard_fraction`` 0);
- ``auto-nostretch``: one-time width costs charged in full to one round (``max_stretch`` 1);
- ``auto-noretrial``: the draft model's acceptance never forgotten (``retrial_wait`` huge);
- ``auto-prior5``: the draft model's prior acceptance 0.5 instead of 0.7.

Prints tok/s per prompt, each configuration's ratio to ``none`` (geometric mean and worst
prompt), and what ``auto`` chose (rounds per source; plain steps); ``--json`` keeps every run.

Usage: python scripts/gpu/auto_variants.py TARGET DRAFT [--ngl -1] [-r 3] [-n 128] [--json F]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import edgespec  # noqa: E402,F401  (the C++ runtime made global before llama.cpp loads)
from edgespec.bench.prompts import load_prompts  # noqa: E402
from edgespec.bench.run import Config, EdgespecRunner, rotate  # noqa: E402
from edgespec.core.policy import DEFAULT_CONFIG  # noqa: E402
from edgespec.core.sampling import SamplingParams  # noqa: E402
from edgespec.runtime.engine import Engine  # noqa: E402

#: variant -> (its config's changes, whether the draft model is loaded for it)
VARIANTS: dict[str, tuple[dict, bool]] = {
    "auto": ({}, True),
    "auto-lookup": ({}, False),
    "auto-noguard": ({"guard_fraction": 0.0}, True),
    "auto-nostretch": ({"max_stretch": 1.0}, True),
    "auto-noretrial": ({"retrial_wait": (10 ** 9, 10 ** 9)}, True),
    "auto-prior5": ({"model_prior": 0.5}, True),
}


@contextlib.contextmanager
def variant(engine: Engine, name: str):
    """The engine with one variant's policy config (and draft model or none) for a run."""
    changes, model = VARIANTS.get(name, ({}, True))
    saved = engine.policy_config, engine.draft
    engine.policy_config = dataclasses.replace(DEFAULT_CONFIG, **changes)
    if not model:
        engine.draft = None
    try:
        yield
    finally:
        engine.policy_config, engine.draft = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--ngl", type=int, default=-1)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json")
    a = ap.parse_args()
    variants = ["none", *a.variants.split(",")]
    engine = Engine.load(a.target, a.draft, n_gpu_layers=a.ngl, draft_n_gpu_layers=a.ngl,
                         progress=False)
    costs = engine.calibrate()
    call, curve = costs.target, costs.target.steady
    print(f"calibration: S(1) {curve(1) * 1e3:.2f} ms, S(4) {curve(4) * 1e3:.2f}, S(8) "
          f"{curve(8) * 1e3:.2f}, S(16) {curve(16) * 1e3:.2f}, S(33) {curve(33) * 1e3:.2f}; "
          f"U {call.changed * 1e3:.2f} ms, C {call.second * 1e3:.2f} ms; draft "
          f"{(costs.draft_per_token or 0) * 1e3:.2f} ms/token", flush=True)
    runner = EdgespecRunner(engine)
    greedy = SamplingParams(temperature=0.0)
    prompts = load_prompts()
    runs = []
    for p in prompts:  # warm-up: one short run of each, unrecorded
        runner.prepare(p)
        for v in variants:
            with variant(engine, v):
                runner.run(Config("auto" if v != "none" else "none"), p, 8, greedy)
    for r in range(a.repeats):
        for p in prompts:
            runner.prepare(p)
            for v in rotate(variants, r):
                with variant(engine, v):
                    t0 = time.perf_counter()
                    m = runner.run(Config("none" if v == "none" else "auto"), p,
                                   a.max_tokens, greedy)
                runs.append({"variant": v, "prompt": p.id, "repeat": r, "tps": m.tokens_per_second,
                             "generated": m.generated, "rounds": m.rounds,
                             "hist": m.draft_length_hist,
                             "by_drafter": m.detail["stats"].get("by_drafter"),
                             "time": m.to_dict()["time"], "wall": time.perf_counter() - t0})
    engine.close()

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    table = {(v, p.id): med([x["tps"] for x in runs if x["variant"] == v and x["prompt"] == p.id])
             for v in variants for p in prompts}
    ids = [p.id for p in prompts]
    print(f"\n{'tok/s (median of ' + str(a.repeats) + ')':<24}" + "".join(f"{i[:14]:>15}" for i in ids)
          + f"{'geo x none':>12}{'worst':>8}")
    for v in variants:
        ratios = [table[v, i] / table["none", i] for i in ids]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"{v:<24}" + "".join(f"{table[v, i]:>15.0f}" for i in ids)
              + f"{geo:>11.3f}x{min(ratios):>7.3f}x")
    print("\nauto's rounds by source (last repeat): plain steps / lookup / model")
    for v in variants[1:]:
        cells = []
        for i in ids:
            last = [x for x in runs if x["variant"] == v and x["prompt"] == i][-1]
            bd = last["by_drafter"] or {}
            cells.append("/".join(str(bd.get(s, {}).get("rounds", 0)) for s in ("none", "lookup", "model")))
        print(f"{v:<24}" + "".join(f"{c:>15}" for c in cells))
    if a.json:
        Path(a.json).write_text(json.dumps({"calibration": {
            "points": {str(k): v for k, v in curve.points.items()},
            "changed": call.changed, "second": call.second,
            "draft_per_token": costs.draft_per_token},
            "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
