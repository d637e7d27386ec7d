"""Greedy bench on a virtual GPU: the real loop and drafters on this CPU, timed as on an H100.

A lent GPU is rare; what ``auto`` does there depends on two things this CPU can supply
exactly and one it can model:

- **what the models say**: in greedy decoding the target's pick and the draft model's pick
  depend only on the context, so the real pair (run here by llama.cpp, batch-exact on the CPU)
  answers every call. Answers are memoised by context on disk, so variants and older commits
  replay the same text at no model cost;
- **edgespec's own host work**: the loop, the drafters and the policy run for real; their time
  is measured with ``time.perf_counter`` as usual;
- **what each llama.cpp call would cost on the GPU**: a model of the vendored ggml-cuda, with
  the figures measured on an H100 (stop 33, default pair, every layer offloaded). Each context
  keeps one CUDA graph: a call replays it (steady cost) only as the third or later call of its
  width in a row; any other call runs without a graph or captures one (steady cost plus a
  penalty). Steady and penalised costs by width come from ``bench --sweep`` there (repeated
  and interleaved widths); the draft model's from its calibration and from the ``model``
  drafter's rounds in ``bench``.

The clock that the loop, the drafters and the cost code read is replaced by a virtual one:
real time minus the time spent answering calls here, plus the modelled GPU time of each call.
Prints tok/s and x none per prompt and overall, like ``bench``; ``--json`` keeps it all.

This is a model, not a measurement: check it against a lease's ``bench`` (run it with
``--tree`` on the commit that lease measured) before trusting what it says of new code.
``--sweep`` and ``--machine`` replay on a lease's own GPU (its sweep's repeated and
interleaved t(k), its bench's calibration); against the 2026-11-28 H100's bench the graph rule
alone left each lone lookup round ~5 ms short, which ``--capture-ms 5`` charges at the capture,
and priced the draft model's calls ~20% low, which ``--draft-scale 1.2`` corrects.
``--fixed-width W`` replays the exact mode (``bench --exact``): every target call W wide, one
shape, ceil(n / W) calls of t(W) from ``--machine``'s calibration; on that lease's
``bench_exact.json`` (W = 8) it gave ``lookup`` 1.57x, ``model`` 1.50x and ``auto`` 1.65x of
``none`` where the lease measured 1.58x, 1.53x and 1.64x, with no scaling.

The loop launches each round's call before it yields the last round, as on a GPU: the call's
modelled time runs while the host works, and only what is left counts when the result is read
(``--in-order``: launched after the yield, as on a CPU).

Usage: python scripts/gpu/replay.py [--drafters none,lookup,model,hybrid,auto] [-r 2]
       [-n 128] [--tree DIR] [--memo FILE] [--calibration sweep|bench] [--capture-ms MS]
       [--policy-capture-ms MS] [--fixed-width W] [--draft-scale X] [--auto-set NAME=VALUE]
       [--in-order]
       [--prompt-file FILE] [--prompts ID,...] [--machine BENCH_JSON] [--sweep SWEEP_JSON]
       [--ceiling]
       [--json FILE]
"""
from __future__ import annotations

import argparse
import ast
import bisect
import dataclasses
import gc
import json
import math
import pickle
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[2]

# The H100's figures (stop 33, /work/gpu-results/2026-11-27/r/sweep.txt): width -> seconds of a
# replayed call (the same width call after call) and of a call after another width.
TARGET_STEADY = {1: 2.26e-3, 2: 2.52e-3, 3: 2.82e-3, 4: 3.19e-3, 6: 3.45e-3, 8: 3.93e-3,
                 12: 4.55e-3, 16: 4.88e-3, 24: 5.34e-3, 32: 6.15e-3}
TARGET_SWITCHED = {1: 4.90e-3, 2: 6.16e-3, 3: 6.52e-3, 4: 6.49e-3, 6: 6.90e-3, 8: 6.76e-3,
                   12: 8.66e-3, 16: 7.84e-3, 24: 9.51e-3, 32: 9.39e-3}
# What the engine's calibration measured there (auto's cost curve, switch penalty and draft
# cost): in the sweep's run (clean), and in the greedy bench's run (t(8) and up polluted by
# stalled calls at start-up: every calibration is one sample of that noise).
CALIBRATIONS = {
    "sweep": ({1: 2.21e-3, 4: 3.16e-3, 8: 3.39e-3, 16: 4.86e-3, 33: 6.19e-3}, 2.38e-3, 1.24e-3),
    "bench": ({1: 2.05e-3, 4: 2.89e-3, 8: 8.00e-3, 16: 13.32e-3, 32: 15.20e-3}, 1.39e-3, 1.14e-3),
}
# The 0.5B draft: ~1.15 ms a replayed single call; ``model`` rounds that accepted everything
# (a 2-token catch-up, then single calls: three penalised calls of four) cost 2.05 ms a
# token, so a penalised call costs ~1.2 ms more. Wider calls scale like the target's.
DRAFT_STEADY_1 = 1.15e-3
DRAFT_PENALTY = 1.2e-3


def _ms(points: dict[int, float]) -> dict[int, float]:
    return {n: round(t * 1e3, 2) for n, t in sorted(points.items())}


def interpolate(table: dict[int, float], width: int) -> float:
    ns = sorted(table)
    if width in table:
        return table[width]
    if width > ns[-1]:
        a, b = ns[-2], ns[-1]
    else:
        i = max(bisect.bisect_left(ns, width), 1)
        a, b = ns[i - 1], ns[i]
    return table[a] + (table[b] - table[a]) * (width - a) / (b - a)


class Device:
    """One llama.cpp context on the GPU: what each call costs under the graph rule."""

    def __init__(self, steady, penalty) -> None:
        self.steady, self.penalty = steady, penalty
        self.last: int | None = None
        self.run = 0
        self.calls = self.penalised = self.captures = 0
        self.capture_cost = 0.0  #: what a capture costs more than a call without a graph

    def counts(self) -> dict[str, int]:
        return {"calls": self.calls, "penalised": self.penalised, "captures": self.captures}

    @staticmethod
    def graph(width: int, last: int | None, run: int) -> tuple[bool, bool]:
        """(replays, captures) for a call of ``width`` after ``run`` calls of width ``last``:
        it replays a graph only as the third or later of its width in a row; the second
        captures one."""
        return width == last and run >= 2, width == last and run == 1

    def cost(self, width: int, last: int | None, run: int) -> float:
        """Seconds of a call of ``width`` after ``run`` calls of width ``last``."""
        replay, capture = self.graph(width, last, run)
        return (self.steady(width) + (0.0 if replay else self.penalty(width))
                + (self.capture_cost if capture else 0.0))

    #: (rng, per-call lognormal sigma, random-walk sigma of the machine's speed) or None
    noise: tuple | None = None
    _speed = 0.0  #: log of the machine's speed factor now (the walk)

    def call(self, width: int) -> float:
        seconds = self.cost(width, self.last, self.run)
        if self.noise is not None:
            rng, jitter, drift = self.noise
            self._speed = min(max(self._speed + drift * rng.standard_normal(), -0.3), 0.3)
            seconds *= math.exp(self._speed + jitter * rng.standard_normal())
        replay, capture = self.graph(width, self.last, self.run)
        self.penalised += not replay
        self.captures += capture
        self.run = self.run + 1 if width == self.last else 1
        self.last = width
        self.calls += 1
        return seconds


def measured_device(curve: dict[int, float], penalty: float) -> Device:
    """A device as a bench calibration saw it: a call costs the curve's t(n), and the switch
    penalty more unless it is the third of its width in a row (none on a CPU)."""
    return Device(lambda w: interpolate(curve, w), lambda w: penalty)


def target_device() -> Device:
    return Device(lambda w: interpolate(TARGET_STEADY, w),
                  lambda w: interpolate(TARGET_SWITCHED, w) - interpolate(TARGET_STEADY, w))


def sweep_devices(sweep: dict) -> tuple[Device, Device]:
    """Target and draft devices from a ``bench --sweep`` result: steady costs from its
    repeated widths, penalties from its interleaved ones (each call after another width)."""
    steady = {int(n): t for n, t in sweep["target_curve_repeated"].items()}
    switched = {int(n): t for n, t in sweep["target_curve"].items()}
    scale = sweep["draft_cost_per_token"] / steady[1]
    target = Device(lambda w: interpolate(steady, w),
                    lambda w: max(interpolate(switched, w) - interpolate(steady, w), 0.0))
    second = sweep.get("target_curve_second")  # (a newer sweep: the capture, measured)
    if second:
        target.capture_cost = statistics.median(
            max(t - steady[int(n)], 0.0) - target.penalty(int(n)) for n, t in second.items())
    return target, Device(lambda w: scale * interpolate(steady, w), lambda w: DRAFT_PENALTY)


def draft_device(steady_1: float = DRAFT_STEADY_1) -> Device:
    """The 0.5B draft on the H100: a single call at ``steady_1``, wider ones scaled like the
    target's, the graph rule's penalty."""
    scale = steady_1 / TARGET_STEADY[1]
    return Device(lambda w: scale * interpolate(TARGET_STEADY, w), lambda w: DRAFT_PENALTY)


class Clock:
    """The virtual clock: real time, minus time spent answering calls, plus their GPU time."""

    def __init__(self) -> None:
        self.device = 0.0
        self.excluded = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.excluded + self.device


class Memo:
    """Greedy picks by context (a 64-bit hash of the token tuple), kept on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.picks: dict[tuple[str, int], int] = {}
        if path.exists():
            with open(path, "rb") as f:
                self.picks = pickle.load(f)
        self.misses = 0

    @staticmethod
    def key(name: str, context) -> tuple[str, int]:
        """Where the pick of model ``name`` after ``context`` is kept."""
        return name, hash(tuple(context))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(self.picks, f)
        tmp.replace(self.path)


class Replayed:
    """A backend for the greedy loop: the real model's picks, the GPU's time.

    Keeps its own token list (the KV cache it stands for); picks come from the memo, or from
    the real backend (synced to the context, one row at a time) on a miss. Rows after the first
    one whose pick differs from the next fed token are never read by the greedy verdict; they
    are not computed (-1)."""

    graph_shapes = True  # a local GPU: single-token catch-ups for the draft (new code)
    #: a GPU's decode is asynchronous: the loop launches a round's call (start_decode) before
    #: it yields the last round, and the call's device time runs while the host works on,
    #: until finish_decode asks for it (``--in-order``: False, as the CPU has it)
    asynchronous = True

    def __init__(self, name: str, real, memo: Memo, device: Device, clock: Clock) -> None:
        self.name, self.real, self.memo, self.device, self.clock = name, real, memo, device, clock
        self.n_ctx = real.n_ctx
        self.n_vocab = real.n_vocab
        self.tokens: list[int] = []

    def __getattr__(self, attr):  # tokenizer, is_eog, ...: the real backend's
        return getattr(self.real, attr)

    def sync(self, prefix) -> int:
        from edgespec.core.lookup import common_prefix  # (the tree main() put on the path)

        return self.trim(common_prefix(self.tokens, prefix))

    def trim(self, n: int) -> int:
        del self.tokens[n:]
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens = []
        self.device.last, self.device.run = None, 0

    def _pick(self, n: int) -> int:
        key = Memo.key(self.name, self.tokens[:n])
        pick = self.memo.picks.get(key)
        if pick is None:
            self.memo.misses += 1
            ctx = self.tokens[:n]
            cached = self.real.sync(ctx[:-1])
            pick = int(self.real.decode_argmax(ctx[cached:], 1)[0])
            self.memo.picks[key] = pick
        return pick

    def decode(self, tokens, n_logits: int):
        """A call whose rows nobody reads (a prefill; a calibration's or warm-up's call): its
        time only, and rows of zeros."""
        t0 = time.perf_counter()
        self.tokens.extend(tokens)
        seconds = self.device.call(len(tokens))
        self.clock.excluded += time.perf_counter() - t0
        self.clock.device += seconds
        return np.zeros((n_logits, 1), np.float32) if n_logits else None

    def decode_argmax(self, tokens, n_logits: int):
        t0 = time.perf_counter()
        start = len(self.tokens)
        self.tokens.extend(tokens)
        end = len(self.tokens)
        out = np.full(n_logits, -1, np.int32)
        for i, pos in enumerate(range(end - n_logits, end)):
            out[i] = self._pick(pos + 1)
            if pos + 1 < end and out[i] != self.tokens[pos + 1]:
                break  # the verdict stops here
        seconds = self.device.call(end - start)
        self.clock.excluded += time.perf_counter() - t0
        self.clock.device += seconds
        return out

    def start_decode(self, tokens, n_logits: int, *, picks: bool = False) -> None:
        if not picks:
            raise NotImplementedError("the replay is greedy only: picks")
        device = self.clock.device
        self._result = self.decode_argmax(tokens, n_logits)
        self._running = self.clock.device - device  # the call's device time, yet to run ...
        self.clock.device = device
        self._launched = self.clock()

    def finish_decode(self):
        # ... while the host works: what is left of it when the result is asked for
        self.clock.device += max(0.0, self._running - (self.clock() - self._launched))
        return self._result


def lookup_ceiling(prompt: list[int], answer: list[int], lookup, device: Device,
                   k_max: int = 32) -> float:
    """How much faster than plain decoding prompt lookup could make ``answer`` on ``device``,
    with perfect foresight: the schedule of draft lengths (0 .. what lookup offers) that takes
    the least modelled device time, found by dynamic programming over (position, last width,
    whether it replays), against plain decoding's time under the same model. ``lookup``'s
    proposals are taken as in plain steps (one token committed a round). No host time on
    either side: a bound for any lookup policy, to say how far ``auto`` is from it."""
    from edgespec.core.lookup import common_prefix  # (the tree main() put on the path)

    context = list(prompt)
    offers: list[tuple[int, int]] = []  # (tokens offered, how many of them are right)
    for i in range(len(answer)):
        draft = lookup.propose(context, k_max, None, None)
        offers.append((len(draft.tokens), common_prefix(draft.tokens, answer[i:])))
        context.append(answer[i])
    n = len(answer)
    cost = device.cost

    # best[(last, run)] at position i: the least time to finish from i; filled from the end
    states = [(w, r) for w in range(0, k_max + 2) for r in (1, 2)]
    after = {state: 0.0 for state in states}
    table = [after]
    for i in range(n - 1, -1, -1):
        here = {}
        offered, right = offers[i]
        for last, run in states:
            best = math.inf
            for k in range(offered + 1):
                width = k + 1
                nxt = min(i + min(k, right) + 1, n)
                state = (width, min(run + 1, 2) if width == last else 1)
                rest = table[n - nxt][state] if nxt < n else 0.0
                best = min(best, cost(width, last, run) + rest)
            here[(last, run)] = best
        table.append(here)
    fastest = table[n][(0, 1)]
    plain = sum(cost(1, 1 if i else 0, min(i, 2)) for i in range(n))
    return plain / fastest if fastest else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafters", default="none,lookup,model,hybrid,auto")
    ap.add_argument("-r", "--repeats", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--tree", help="an edgespec source tree to run (another commit's checkout)")
    ap.add_argument("--memo", help="the memo of picks (default: one per pair of model files, "
                    "in ~/.cache/edgespec/replay)")
    ap.add_argument("--prompt-file", help="a JSONL prompt set, as bench takes (default: the "
                    "built-in one); scripts/gpu/heldout.jsonl holds prompts kept out of tuning")
    ap.add_argument("--prompts", default="", help="comma-separated prompt ids (default: all)")
    ap.add_argument("--calibration", choices=sorted(CALIBRATIONS), default="sweep")
    ap.add_argument("--capture-ms", type=float, default=0.0,
                    help="what a graph capture costs more than a call without one (target)")
    ap.add_argument("--policy-capture-ms", type=float,
                    help="older trees (--tree, before auto's costs were S, U, C): the return "
                    "penalty their calibration starts from (default: --capture-ms)")
    ap.add_argument("--machine", metavar="BENCH_JSON",
                    help="replay on the machine a bench results file calibrated (its target "
                    "curve, switch penalty and draft cost) instead of the H100: on a CPU, the "
                    "same choices as bench makes there without its timing noise")
    ap.add_argument("--sweep", metavar="SWEEP_JSON",
                    help="the GPU as a lease's `bench --sweep` measured it (its repeated and "
                    "interleaved t(k), its draft cost) instead of the stop-33 H100; with "
                    "--machine, auto's calibration is that file's and the devices this one's")
    ap.add_argument("--fixed-width", type=int, default=0, metavar="W",
                    help="the target at a fixed width (exact mode, bench --exact): every call "
                    "costs ceil(n / W) calls of t(W), one shape, never a switch penalty; t(W) "
                    "from --machine's calibration (a bench --exact results file); the draft "
                    "model keeps the graph rule")
    ap.add_argument("--draft-scale", type=float, default=1.0,
                    help="the draft model's calls cost this many times the model's price "
                    "(1.2 fitted the 2026-11-28 H100 lease's model and hybrid runs)")
    ap.add_argument("--auto-set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a PolicyConfig field for the run (e.g. margin=0.05; on older "
                    "--tree trees an AutoDrafter class attribute): the variants "
                    "auto_variants.py measures on a GPU")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="each call's time times exp(N(0, JITTER)): a noisy machine")
    ap.add_argument("--drift", type=float, default=0.0,
                    help="and times exp(W), W a random walk of steps N(0, DRIFT) within "
                    "+-0.3: a machine whose speed wanders (this CPU VM's does, 14-19 tok/s)")
    ap.add_argument("--seed", type=int, default=0, help="of --jitter and --drift")
    ap.add_argument("--ceiling", action="store_true",
                    help="also the lookup ceiling: perfect-foresight lookup on the same "
                    "answers and device model (needs drafter none)")
    ap.add_argument("--in-order", action="store_true",
                    help="launch each round after the last is yielded, as on a CPU (default: "
                    "ahead, as on a GPU)")
    ap.add_argument("--json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else HERE))

    import edgespec  # noqa: F401  (llama.cpp's runtime first, as the package arranges)
    from edgespec.bench.prompts import load_prompts
    from edgespec.core import costs as costs_module
    from edgespec.core.costs import CostCurve
    from edgespec.core.sampling import SamplingParams
    from edgespec.core.stats import Stats
    from edgespec.runtime import drafters as drafters_module, engine as engine_module
    from edgespec.runtime import loop as loop_module
    from edgespec.runtime.drafters import make_drafter
    from edgespec.runtime.engine import Engine, effective_draft_length
    from edgespec.core.sampling import make_rng

    print(f"edgespec from {Path(edgespec.__file__).parent}", file=sys.stderr)
    clock = Clock()
    virtual = types.SimpleNamespace(perf_counter=clock, sleep=time.sleep, time=time.time)
    timed = [loop_module, drafters_module, costs_module]
    try:  # (a tree with one module per source: the modules that read the clock)
        from edgespec.runtime.sources import auto as auto_source, model as model_source
        timed += [auto_source, model_source]
    except ImportError:
        pass
    for mod in timed:
        mod.time = virtual

    engine = Engine.load(progress=False)
    pair = f"{Path(engine.target.path).stem}+{Path(engine.draft.path).stem}"
    memo = Memo(Path(args.memo) if args.memo else
                Path.home() / ".cache/edgespec/replay" / f"{pair}.pkl")
    # the memo's millions of objects out of the collector's way: a full collection among them
    # (~45 ms) landing in a round was charged to the host's work there (auto priced lookup
    # from its first proposal at ~7 ms a round and waited rounds before drafting)
    gc.freeze()
    points, penalty, per_token = CALIBRATIONS[args.calibration]
    devices = (target_device(), draft_device())
    where = "virtual H100 (model of the vendored ggml-cuda's graph rule, stop-33 figures)"
    if args.machine:
        calibration = json.loads(Path(args.machine).read_text())["machine"]["calibration"]
        points = {int(n): t for n, t in calibration["target_curve"].items()}
        penalty = calibration.get("switch_penalty", calibration.get("changed", 0.0))
        per_token = calibration["draft_per_token"]
        devices = (measured_device(points, penalty),  # (a draft call: n tokens, n x its cost)
                   measured_device({1: per_token, 2: 2 * per_token}, 0.0))
        where = f"the machine {args.machine} calibrated"
    if args.fixed_width:
        per_call = interpolate(points, args.fixed_width)
        points, penalty = {args.fixed_width: per_call}, 0.0
        devices = (Device(lambda w: -(-w // args.fixed_width) * per_call, lambda w: 0.0),
                   draft_device(per_token))
        where = f"a fixed width of {args.fixed_width} on {args.machine or 'the H100'}"
    if args.sweep:
        devices = sweep_devices(json.loads(Path(args.sweep).read_text())["sweep"])
        where = f"the GPU {args.sweep} swept (graph rule as above)"
    if args.draft_scale != 1.0:
        scaled = devices[1]
        steady, penalty_of = scaled.steady, scaled.penalty
        scaled.steady = lambda w: args.draft_scale * steady(w)
        scaled.penalty = lambda w: args.draft_scale * penalty_of(w)
    new_policy = hasattr(costs_module, "CallCosts")  # (else an older tree: its own knobs)
    for setting in args.auto_set:
        name, value = setting.split("=", 1)
        if new_policy:  # a PolicyConfig field (a typo fails in replace)
            engine.policy_config = dataclasses.replace(engine.policy_config,
                                                       **{name: ast.literal_eval(value)})
        else:
            getattr(drafters_module.AutoDrafter, name)  # (an attribute it has)
            setattr(drafters_module.AutoDrafter, name, ast.literal_eval(value))
    target = Replayed("target", engine.target, memo, devices[0], clock)
    draft = Replayed("draft", engine.draft, memo, devices[1], clock)
    graphs = bool(penalty) or bool(args.sweep)
    on_gpu = graphs or bool(args.fixed_width)
    target.graph_shapes, draft.graph_shapes = graphs and not args.fixed_width, on_gpu  # (as the backend has them)
    target.asynchronous = draft.asynchronous = not args.in_order and on_gpu
    if args.capture_ms or not target.device.capture_cost:
        target.device.capture_cost = args.capture_ms * 1e-3
    if args.jitter or args.drift:
        noise_rng = np.random.default_rng(args.seed)
        target.device.noise = draft.device.noise = (noise_rng, args.jitter, args.drift)
    if new_policy:  # the engine's own calibration, on the virtual devices
        if hasattr(engine, "clock"):  # the calibration reads the engine's clock
            engine.clock = clock
        else:  # (trees before it read their module's time)
            from edgespec.runtime import calibration as calibration_module

            calibration_module.time = virtual
        real_target, real_draft = engine.target, engine.draft
        engine.target, engine.draft = target, draft
        target.fixed_width = args.fixed_width
        costs = engine.calibrate(force=True)
        engine.target, engine.draft = real_target, real_draft
        curve = costs.target.steady
        print(f"calibrated: S {_ms(curve.points)} ms, U {costs.target.changed * 1e3:.2f} ms, "
              f"C {costs.target.second * 1e3:.2f} ms, draft {costs.draft_per_token * 1e3:.2f} "
              "ms a token", file=sys.stderr)
    else:
        curve = CostCurve(dict(points), width=args.fixed_width, switch_penalty=penalty)
        # (what a calibration there measures: measure_return_penalty finds the capture's cost
        # in this model of the device)
        curve.return_penalty = (args.capture_ms if args.policy_capture_ms is None
                                else args.policy_capture_ms) * 1e-3 if penalty else 0.0
        engine.costs = engine_module.Costs(curve, per_token, 0.0)
    prompts = load_prompts(args.prompt_file)
    if args.prompts:
        keep = set(args.prompts.split(","))
        prompts = [p for p in prompts if p.id in keep]
    names = args.drafters.split(",")
    params = SamplingParams(temperature=0.0)
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.repeats):
        for prompt in prompts:
            tokens = engine.prompt_tokens(prompt.payload, chat=not prompt.raw)
            limit = prompt.max_tokens or args.max_tokens
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                k = effective_draft_length(name, None)
                policy = engine._policy() if name == "auto" else None
                drafter = make_drafter(name, draft if name != "none" else None, target.n_vocab,
                                       policy=policy)
                target.reset()
                draft.reset()
                loop_module.prefill(target, tokens)
                wants = getattr(drafter, "wants_prompt_cached", None)
                if name != "none" and wants is not None and wants(k):
                    loop_module.prefill(draft, tokens)
                stats = Stats(prompt_tokens=len(tokens))
                start = clock()
                dev0 = clock.device
                before = {m.name: m.device.counts() for m in (target, draft)}
                generated, n_rounds, by_source = 0, 0, {}
                played = loop_module.rounds(target, drafter, tokens, params, make_rng(0), k,
                                            stats, limit)
                for rnd in played:
                    n_rounds += 1
                    by_source[rnd.drafter] = by_source.get(rnd.drafter, 0) + 1
                    done = False
                    for tok in rnd.tokens:
                        if engine.target.is_eog(tok):
                            done = True
                            break
                        generated += 1
                        if generated >= limit:
                            done = True
                            break
                    if done:
                        break
                seconds = clock() - start
                played.close()  # (a round launched ahead and not taken: waited for after)
                runs.setdefault((prompt.id, name), []).append({
                    "tokens": generated, "seconds": seconds, "rounds": n_rounds,
                    "device_s": clock.device - dev0, "by_source": by_source,
                    "choices": dict(getattr(drafter, "choices", {})),
                    **{f"{m.name}_{key}": count - before[m.name][key]
                       for m in (target, draft) for key, count in m.device.counts().items()}})
            memo.save()
        print(f"repeat {rep + 1}: {memo.misses} model calls here so far; auto's curve now "
              f"{_ms(curve.points)} ms", file=sys.stderr)

    def rate(pid, name):
        return statistics.median(r["tokens"] / r["seconds"] for r in runs[(pid, name)])

    print(f"{where}; greedy, median of {args.repeats}, up to {args.max_tokens} tokens")
    print(f"{'prompt':16} {'drafter':8} {'tok/s':>7} {'x none':>7} {'tok/rnd':>7} "
          f"{'host%':>6} {'pen t/d':>9}  rounds by source")
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for prompt in prompts:
        base = rate(prompt.id, "none") if "none" in names else None
        for name in names:
            r = rate(prompt.id, name)
            last = runs[(prompt.id, name)][-1]
            x = r / base if base else float("nan")
            ratios[name].append(x)
            host = 1 - last["device_s"] / last["seconds"]
            print(f"{prompt.id if name == names[0] else '':16} {name:8} {r:7.1f} {x:6.2f}x "
                  f"{last['tokens'] / max(last['rounds'], 1):7.2f} {100 * host:5.1f}% "
                  f"{last['target_penalised']:4}/{last['draft_penalised']:<4}  "
                  f"{last['by_source']}")
    if args.ceiling and "none" in names:
        from edgespec.runtime.drafters import LookupDrafter

        ratios["ceiling"] = []
        for prompt in prompts:
            tokens = engine.prompt_tokens(prompt.payload, chat=not prompt.raw)
            limit = prompt.max_tokens or args.max_tokens
            answer, context = [], list(tokens)
            while len(answer) < limit:  # the greedy answer, from the memo none filled
                pick = memo.picks.get(Memo.key("target", context))
                if pick is None or engine.target.is_eog(pick):
                    break
                answer.append(pick)
                context.append(pick)
            x = lookup_ceiling(tokens, answer, LookupDrafter(), devices[0])
            ratios["ceiling"].append(x)
            print(f"{prompt.id:16} ceiling {x:6.2f}x  (lookup, perfect foresight, device "
                  "time only)")
        names = names + ["ceiling"]
    print()
    print(f"{'drafter':8} {'x none':>7} {'worst':>7}")
    for name in names:
        xs = ratios[name]
        geo = math.exp(sum(math.log(x) for x in xs) / len(xs))
        print(f"{name:8} {geo:6.3f}x {min(xs):6.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"runs": {f"{p}|{n}": v for (p, n), v in runs.items()}}, indent=1))


if __name__ == "__main__":
    main()
