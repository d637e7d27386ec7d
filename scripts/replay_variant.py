"""Run scripts/gpu/replay.py on another tree with the garbage collector off, an optional
starting curve for older trees and an optional policy variant; optionally log every choice.

    python scripts/replay_variant.py TREE VARIANT [--replay REPLAY_PY] -- REPLAY_ARGS...

TREE: an edgespec checkout (also pass --tree TREE to replay). VARIANT: ``base``, or
``nohold`` (a tree with ``Policy.choose(Offer)``: where the costs have no graphs, the last
round's choice is not kept; drafting must still beat plain decoding by the margin).
Environment: NOISY_CURVE='{"1": ms, "4": ms, "16": ms}' starts an older tree's (before
CallCosts) cost curve from these points instead of --machine's (to give it the calibration a
newer tree measured on a jittered replay); TRACE=FILE writes every choice and round as JSON.

Why gc off: with the replay's memo (a dict of every pick) in the heap, a full collection costs
~45 ms; one that falls inside the first lookup proposal is charged to lookup's host-cost estimate
(~7 ms a round for the next ~10 rounds, against a 65 ms plain step on a 2-core CPU) and delays
lookup by several rounds, in whichever tree's allocation pattern triggers it.
"""
import sys, runpy, gc
tree, variant = sys.argv[1], sys.argv[2]
args = sys.argv[sys.argv.index("--") + 1:]
own = sys.argv[3:sys.argv.index("--")]
from pathlib import Path
replay = own[own.index("--replay") + 1] if "--replay" in own else str(Path(__file__).resolve().parent / "gpu" / "replay.py")
sys.path.insert(0, tree)
import edgespec  # noqa
from edgespec.core import policy as P
gc.disable()
import os, json, json as _json
if os.environ.get("NOISY_CURVE"):  # older trees: start auto's curve from these points (ms)
    from edgespec.core import costs as C
    _pts = {int(k): v * 1e-3 for k, v in _json.loads(os.environ["NOISY_CURVE"]).items()}
    _orig_post = C.CostCurve.__post_init__
    _done = []
    _machine = json.loads(Path(args[args.index("--machine") + 1]).read_text())
    _t1 = float(_machine["machine"]["calibration"]["target_curve"]["1"])
    def _post(self):  # (the curve the replay builds from --machine's points: its t(1))
        if not _done and abs(float(self.points.get(1, 0)) - _t1) < 1e-12:
            _done.append(1)
            print("old tree's curve from NOISY_CURVE", _pts, file=sys.stderr)
            self.points = dict(_pts)
        _orig_post(self)
    C.CostCurve.__post_init__ = _post
if variant == "nohold":
    orig = P.Policy.choose
    def choose(self, offer):
        if self.costs.graphs:
            return orig(self, offer)
        saved = self._last_source
        self._last_source = None   # no incumbent but plain decoding: margin only against plain
        try:
            return orig(self, offer)
        finally:
            self._last_source = saved
    P.Policy.choose = choose
if os.environ.get("TRACE"):
    from edgespec.runtime import drafters as D
    log = []
    orig_choose = P.Policy.choose
    def curve(self):
        c = getattr(self, "curve", None) or self.costs.steady
        return [round(float(x) * 1e3, 2) for x in c.table(12)[1:]]
    def choose(self, *a, **kw):
        c = orig_choose(self, *a, **kw)
        if a and hasattr(a[0], "k_max"):
            o = a[0]; k_max, n_lk, ng = o.k_max, o.lookup_len, o.ngram
        else:
            k_max = a[0]; n_lk = a[1] if len(a) > 1 else kw.get("lookup_len", 0)
            ng = a[2] if len(a) > 2 else kw.get("lookup_ngram", 0)
        rec = {"k_max": k_max, "offer": n_lk, "ngram": ng, "choice": [c.source, c.k, c.rate, c.baseline],
               "probe": kw.get("probe", False),
               "alphas": {n: round(e.alpha, 3) for n, e in sorted(self.lookup.items())},
               "model_alpha": round(self.model.alpha, 3), "lc": round(self.lookup_cost.seconds*1e3, 3),
               "last_source": getattr(self, "_last_source", None), "last_width": getattr(self, "last_width", None)}
        if n_lk:
            n = min(k_max, n_lk)
            E = self.lookup_expected(ng, n)
            t = (getattr(self, "curve", None) or self.costs.steady).table(n + 1)[2:]
            rates = E / (t + self.lookup_cost.seconds)
            rec["rates"] = [round(float(r), 3) for r in rates[:12]]
            rec["argmax"] = int(rates.argmax()) + 1
        if len(log) % 20 == 0:
            rec["curve"] = curve(self)
        log.append(rec)
        return c
    P.Policy.choose = choose
    orig_obs = D.AutoDrafter.observe
    def observe(self, o):
        src = o.draft.source if o.draft is not None and o.drafted else "none"
        log.append({"round": [src, o.drafted, o.accepted, len(o.new_tokens)]})
        return orig_obs(self, o)
    D.AutoDrafter.observe = observe
    orig_prop = D.AutoDrafter.propose
    def propose(self, *a, **kw):
        log.append({"propose": True})
        return orig_prop(self, *a, **kw)
    D.AutoDrafter.propose = propose
sys.argv = ["replay.py"] + args
try:
    runpy.run_path(replay, run_name="__main__")
finally:
    if os.environ.get("TRACE"):
        json.dump(log, open(os.environ["TRACE"], "w"))

