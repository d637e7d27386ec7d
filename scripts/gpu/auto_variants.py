"""``auto`` against ``none`` and against variants of its own policy, on one loaded engine.

On a lent GPU the models load once per lease and a 128-token run takes a fraction of a second,
so the questions "where does ``auto`` lose against plain decoding, and which part of its policy
costs it" are cheap to answer in the same process: every configuration runs on every bench
prompt, interleaved (order rotated each repeat), and each variant changes one thing:

- ``auto``: as shipped;
- ``auto-lookup``: no draft model (its trials and re-trials cost nothing);
- ``auto-noreprobe``: no re-trial of the draft model and no cost probe of longer lookup drafts;
- ``auto-noguard``: no check of what each source delivered (``policy.Realized``: a source
  whose rounds deliver less than plain steps sits out);
- ``auto-nopenalty``: the width-switch penalty measured at calibration is not charged;
- ``auto-noreturn``: no return penalty (``CostCurve.return_penalty`` at 0 and not learned):
  the code before it, which charged a lone round 3P where the 2026-11-28 lease's ``bench``
  fitted ~3P + 5 ms;
- ``auto-workfirst``: no plain step launched before ``auto``'s work on it (``plain_next``
  always False: the code the 2026-11-28 lease measured, where ``auto``'s plain steps ran
  0.93-0.98x of ``none``);
- ``auto-hold``: an experiment, not yet shipped (``AutoDrafter.HOLD_K`` = 4): where lookup has
  been right in most recent rounds, every round 5 wide, lookup's draft where it offers one and
  the draft model's elsewhere, as ``hybrid`` plays (which beat ``auto`` on 6 of 7 edits in the
  H200 lease), judged as one source by the guard;
- ``auto-holdlong``: ``auto-hold`` that plays lookup's drafts longer than 4 where auto's own
  choice would (``AutoDrafter.HOLD_LONG``): the 2026-11-28 lease's ``auto-hold`` won on
  type-hints (1.20x of ``auto``) and lost on rename (0.86x), where long drafts pay.

Prints tok/s per prompt, each configuration's ratio to ``none`` (geometric mean and worst
prompt), and what ``auto`` chose (rounds per source; plain steps); ``--json`` keeps every run.

Usage: python scripts/gpu/auto_variants.py TARGET DRAFT [--ngl -1] [-r 3] [-n 128] [--json F]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import edgespec  # noqa: E402,F401  (the C++ runtime made global before llama.cpp loads)
from edgespec.bench.prompts import load_prompts  # noqa: E402
from edgespec.bench.run import Config, EdgespecRunner, rotate  # noqa: E402
from edgespec.core import policy as policy_module  # noqa: E402
from edgespec.core.sampling import SamplingParams  # noqa: E402
from edgespec.runtime import drafters as drafters_module  # noqa: E402
from edgespec.runtime.engine import Engine  # noqa: E402

VARIANTS = ("auto", "auto-noreturn", "auto-workfirst", "auto-lookup", "auto-noreprobe",
            "auto-noguard", "auto-nopenalty", "auto-hold", "auto-holdlong")


@contextlib.contextmanager
def variant(engine: Engine, name: str):
    """Patch one part of auto's policy for the duration of a run."""
    saved_policy = engine._policy
    saved_guard = policy_module.GUARD_FRACTION
    saved_reprobe = drafters_module.AutoDrafter.REPROBE_ROUNDS
    saved_retry = drafters_module.AutoDrafter.RETRY_MIN
    saved_hold = drafters_module.AutoDrafter.HOLD_K
    saved_next = drafters_module.AutoDrafter.plain_next
    saved_long = drafters_module.AutoDrafter.HOLD_LONG
    curve = engine.costs.target
    saved_penalty, saved_return = curve.switch_penalty, curve.return_penalty
    try:
        if name == "auto-lookup":
            def no_model():
                p = saved_policy()
                p.draft_cost = None
                return p
            engine._policy = no_model
        elif name == "auto-noreprobe":
            drafters_module.AutoDrafter.REPROBE_ROUNDS = 10 ** 9
            drafters_module.AutoDrafter.RETRY_MIN = 10 ** 9
        elif name == "auto-noguard":
            policy_module.GUARD_FRACTION = 0.0
        elif name == "auto-nopenalty":
            curve.switch_penalty = 0.0
        elif name == "auto-noreturn":
            curve.return_penalty = 0.0
            curve.observe_return = lambda seconds: None
        elif name == "auto-hold":
            drafters_module.AutoDrafter.HOLD_K = 4
        elif name == "auto-holdlong":
            drafters_module.AutoDrafter.HOLD_K = 4
            drafters_module.AutoDrafter.HOLD_LONG = True
        elif name == "auto-workfirst":
            drafters_module.AutoDrafter.plain_next = lambda self, k_max: False
        yield
    finally:
        engine._policy = saved_policy
        policy_module.GUARD_FRACTION = saved_guard
        drafters_module.AutoDrafter.REPROBE_ROUNDS = saved_reprobe
        drafters_module.AutoDrafter.RETRY_MIN = saved_retry
        drafters_module.AutoDrafter.HOLD_K = saved_hold
        drafters_module.AutoDrafter.plain_next = saved_next
        drafters_module.AutoDrafter.HOLD_LONG = saved_long
        curve.switch_penalty = saved_penalty
        if name == "auto-noreturn":
            del curve.observe_return
            curve.return_penalty = saved_return


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
    curve = costs.target
    print(f"calibration: t(1) {curve(1) * 1e3:.2f} ms, t(4) {curve(4) * 1e3:.2f}, t(8) "
          f"{curve(8) * 1e3:.2f}, t(16) {curve(16) * 1e3:.2f}, t(33) {curve(33) * 1e3:.2f}; "
          f"switch penalty {curve.switch_penalty * 1e3:.2f} ms, return penalty "
          f"{curve.return_penalty * 1e3:.2f} ms; draft "
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
            "points": {str(k): v for k, v in curve.points.items()} if hasattr(curve, "points") else None,
            "switch_penalty": curve.switch_penalty, "return_penalty": curve.return_penalty,
            "draft_per_token": costs.draft_per_token},
            "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
