"""The same-moment speedup (edgespec.core.speedup): its arithmetic on hand-made stats, and the
engine's figure on a simulated clock (tests/fakes.Clock, TimedLM), where every second is a
target call of known cost, so the expected ratios are exact.
"""

from __future__ import annotations

import json

import pytest

from edgespec.core.sampling import SamplingParams
from edgespec.core.costs import CallCosts, CostCurve
from edgespec.core.speedup import CURVE, MEASURED, BaselineRule, CallMeter, same_moment_speedup
from edgespec.core.stats import Stats
from edgespec.runtime.engine import Engine
from edgespec.server.metrics import Metrics, prometheus_text

from .fakes import TimedLM, Clock, Scripted, Table

GREEDY = SamplingParams(temperature=0)
BOS, EOG = 0, 1
V = 128


def cpu_like(n: int) -> float:
    """A CPU's t(n): a fixed part and a part per token (exact in binary floating point)."""
    return 0.03125 + 0.0078125 * n


# ---- the arithmetic ----------------------------------------------------------------------------


def plain_stats(steps: int, step: float, *, eog: bool = False, drafting: float = 0.0) -> Stats:
    stats = Stats(time_prefill=1.0)
    for _ in range(steps):
        stats.record_round("none", 0, 0, drafting, step * 0.9, step * 0.05)
        CallMeter(None, stats.calls).add(1, step * 0.9)
    stats.generated = steps - eog
    stats.eog = eog
    stats.time_total = 1.0 + steps * step
    return stats


@pytest.mark.parametrize("steps", [1, 3, 100])
@pytest.mark.parametrize("eog", [False, True])
def test_nothing_drafted_is_exactly_one(steps, eog):
    # whatever the timings (here a third of each round is neither drafting, target nor sampling,
    # and auto's proposal takes some), a turn of plain steps is its own baseline
    stats = plain_stats(steps, 0.037, eog=eog, drafting=0.002)
    speedup = stats.speedup
    assert speedup.ratio == 1.0  # exactly, not by rounding
    assert (speedup.basis, speedup.samples) == (MEASURED, steps)
    assert speedup.target_only_tokens_per_second == stats.tokens_per_second
    assert "1.00x vs target-only (measured in turn" in stats.summary()


#: A calibrated curve on which a call of n tokens costs (1 + (n - 1) / 2) plain calls.
HALF = CallCosts(CostCurve({1: 1.0, 3: 2.0}))


def mixed_stats(*, plain: int, spec: list[tuple[int, int]], t1: float, curve=None,
                other: float = 0.0, sampling: float = 0.0) -> Stats:
    """Plain steps of ``t1`` each, and speculative rounds (drafted k, accepted a) whose target
    call costs ``t1 * (1 + k / 2)``; ``other`` per round outside the parts the loop times."""
    stats = Stats(time_prefill=0.5)
    meter = CallMeter(curve, stats.calls)
    for _ in range(plain):
        stats.record_round("none", 0, 0, 0.0, t1, sampling)
        meter.add(1, t1)
    for k, a in spec:
        stats.record_round("lookup", k, a, 0.001, t1 * (1 + k / 2), sampling)
        meter.add(k + 1, t1 * (1 + k / 2))
    stats.generated = plain + sum(a + 1 for _, a in spec)
    busy = stats.time_drafting + stats.time_target + stats.time_sampling
    stats.time_total = 0.5 + busy + other * stats.rounds
    return stats


def test_measured_basis_replaces_each_round_by_the_plain_steps_it_saved():
    t1, other, sampling = 0.04, 0.002, 0.001
    spec = [(8, 8), (8, 3), (4, 0)]
    stats = mixed_stats(plain=10, spec=spec, t1=t1, other=other, sampling=sampling)
    speedup = stats.speedup
    assert (speedup.basis, speedup.samples) == (MEASURED, 10)
    step = t1 + sampling + other
    expected = (10 + 9 + 4 + 1) * step / stats.decode_time
    assert speedup.ratio == pytest.approx(expected, rel=1e-12)
    assert speedup.target_only_tokens_per_second == pytest.approx(24 / (24 * step), rel=1e-12)


def test_curve_basis_converts_every_call_by_the_curves_shape():
    # two plain steps (too few alone) and rounds whose calls cost (1 + k/2) t(1) by the curve;
    # the machine now runs at t(1) = 0.05 whatever the curve measured at start-up
    spec = [(8, 8), (8, 8), (8, 5), (4, 4)]
    stats = mixed_stats(plain=2, spec=spec, t1=0.05, curve=HALF)
    speedup = stats.speedup
    assert (speedup.basis, speedup.samples) == (CURVE, 6)
    assert speedup.ratio == pytest.approx((2 + 9 + 9 + 6 + 5) * 0.05 / stats.decode_time, rel=1e-12)
    # with no curve there is nothing to convert them with
    assert mixed_stats(plain=2, spec=spec, t1=0.05).speedup is None
    assert "speedup n/a (too few plain steps, no cost curve)" in mixed_stats(
        plain=2, spec=spec, t1=0.05).summary()


def test_the_rule_sets_how_many_plain_steps_make_a_measured_baseline():
    stats = mixed_stats(plain=5, spec=[(8, 8)], t1=0.05, curve=HALF)
    assert stats.speedup.basis == CURVE
    assert same_moment_speedup(stats, BaselineRule(min_plain_steps=5)).basis == MEASURED


def test_no_round_no_figure():
    assert Stats().speedup is None
    assert Stats().to_dict()["speedup"] is None
    assert "speedup n/a (no round)" in Stats().summary()


# ---- the engine on a simulated clock -----------------------------------------------------------


def engine_on_clock(script, *, drafter: str, k: int = 8, prefill: float = 0.25):
    """An engine whose greedy target text is ``script`` after the prompt, on a simulated clock
    where a target call of n tokens costs :func:`cpu_like` (n), calibrated at start-up."""
    clock = Clock()
    table = Scripted(Table(V, 5, banned=[BOS, EOG]), script, len(prompt_tokens()))
    target = TimedLM(table, clock, cpu_like, prefill=prefill, n_ctx=512, eog=[EOG], bos=BOS)
    engine = Engine(target, None, drafter=drafter, draft_length=k, clock=clock)
    engine.calibrate()
    return engine


PROMPT = "copy this line: " + "".join(chr(65 + i) for i in range(26))


def prompt_tokens() -> list[int]:
    return TimedLM(Table(V), Clock(), cpu_like, eog=[EOG], bos=BOS).tokenize(PROMPT)


def fresh_tokens(n: int) -> list[int]:
    """``n`` distinct tokens that occur nowhere in the prompt: no n-gram for lookup to find."""
    unused = [t for t in range(2, V) if t not in prompt_tokens()]
    assert len(unused) >= n
    return unused[:n]


def copy_script(fresh: int) -> list[int]:
    """``fresh`` tokens (plain steps), then the prompt's last 26 tokens again (a copy: lookup's
    drafts all accepted), then EOG."""
    return fresh_tokens(fresh) + prompt_tokens()[-26:] + [EOG]


def widths_after(target, calls_before: int) -> list[int]:
    """Widths of the target calls the answer made (the prefill's call reads no logits)."""
    return [len(c.tokens) for c in target.calls[calls_before:] if c.n_logits]


@pytest.mark.parametrize("slowdown", [1.0, 2.0])
@pytest.mark.parametrize("basis", [MEASURED, CURVE])
def test_accepted_lookup_drafts_give_the_exact_expected_ratio(slowdown, basis):
    engine = engine_on_clock(copy_script(fresh=12), drafter="lookup")
    engine.target.slowdown = slowdown  # after start-up: the curve's absolute figures are stale
    before = len(engine.target.calls)
    out = engine.complete(PROMPT, chat=False, sampling=GREEDY, max_tokens=100)
    stats = out.stats
    assert out.finish_reason == "stop" and stats.eog and stats.generated == 12 + 26
    assert stats.accepted >= 22  # the copy after its first two tokens (the last drafts meet EOG)
    widths = widths_after(engine.target, before)
    # plain decoding pays t(1) for each token and for the EOG; the turn paid its calls
    expected = (stats.generated + 1) * cpu_like(1) / sum(cpu_like(n) for n in widths)
    rule = BaselineRule() if basis == MEASURED else BaselineRule(min_plain_steps=10**6)
    speedup = same_moment_speedup(stats, rule)
    assert speedup.basis == basis
    assert stats.plain.rounds >= BaselineRule().min_plain_steps
    assert speedup.ratio == pytest.approx(expected, rel=1e-12)
    assert speedup.ratio > 1.5  # (the copy's rounds are long enough to pay on this t(n))


def test_the_curve_basis_keeps_the_calibrated_shape_while_auto_refines_its_curve():
    # auto refines the curve with the calls it plays: after a slowdown its drafting widths
    # follow at once and t(1) (few plain steps) lags. The shape that converts calls to t(1)
    # is the calibration's, measured at one moment: the figure stays exact.
    engine = engine_on_clock(copy_script(fresh=3), drafter="auto", k=None)
    engine.target.slowdown = 2.0
    before = len(engine.target.calls)
    stats = engine.complete(PROMPT, chat=False, sampling=GREEDY, max_tokens=100).stats
    widths = widths_after(engine.target, before)
    assert max(widths) > 4 and stats.plain.rounds < BaselineRule().min_plain_steps
    assert engine.costs.target.steady(max(widths)) / engine.costs.target.steady(1) != pytest.approx(
        cpu_like(max(widths)) / cpu_like(1), rel=0.05)  # the refined curve's shape moved
    speedup = stats.speedup
    assert speedup.basis == CURVE
    expected = (stats.generated + 1) * cpu_like(1) / sum(cpu_like(n) for n in widths)
    assert speedup.ratio == pytest.approx(expected, rel=1e-12)


def gpu_like(n: int) -> float:
    """A GPU's t(n): nearly flat (exact in binary floating point)."""
    return 0.001953125 + 0.0001220703125 * n


#: What a call of a new width costs more on that GPU (no replayed CUDA graph): half a t(1).
PENALTY = 0.0009765625


@pytest.mark.parametrize("basis", [MEASURED, CURVE])
def test_on_a_gpu_plain_steps_after_a_width_change_are_not_the_baseline(basis):
    # A copy broken twice by new text: lookup's rounds, then plain steps again. The first two
    # plain calls after a drafting round pay a graph switch that plain decoding never pays
    # (its calls all replay one graph): they do not measure t(1), and their penalties are
    # not target-only time.
    letters = prompt_tokens()[-26:]
    fresh = fresh_tokens(14)
    script = (fresh[:8] + letters[:8] + fresh[8:11] + letters[8:16] + fresh[11:] + letters[16:]
              + [EOG])
    clock = Clock()
    table = Scripted(Table(V, 5, banned=[BOS, EOG]), script, len(prompt_tokens()))
    target = TimedLM(table, clock, gpu_like, prefill=0.0625, changed=PENALTY, second=PENALTY, n_ctx=512,
                       eog=[EOG], bos=BOS)
    engine = Engine(target, None, drafter="lookup", draft_length=8, clock=clock)
    engine.calibrate()
    assert engine.costs.calibrated.changed == pytest.approx(PENALTY, rel=1e-9)
    assert engine.costs.calibrated.second == pytest.approx(PENALTY, rel=1e-9)
    before = len(target.calls)
    stats = engine.complete(PROMPT, chat=False, sampling=GREEDY, max_tokens=100).stats
    assert stats.eog and stats.generated == len(script) - 1 and stats.accepted >= 15
    assert stats.calls.plain >= BaselineRule().min_plain_steps  # the steady ones
    assert stats.calls.plain_penalties >= 4 * PENALTY  # after each drafting stretch, and EOG's
    widths = widths_after(target, before)
    expected = (stats.generated + 1) * gpu_like(1) / stats.decode_time
    assert stats.decode_time > sum(gpu_like(n) for n in widths)  # the turn paid its switches
    rule = BaselineRule() if basis == MEASURED else BaselineRule(min_plain_steps=10**6)
    speedup = same_moment_speedup(stats, rule)
    assert speedup.basis == basis
    assert speedup.ratio == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("drafter", ["none", "auto"])
def test_plain_turns_read_one_when_target_calls_turn_twice_as_slow_after_start_up(drafter):
    engine = engine_on_clock(fresh_tokens(30), drafter=drafter)
    t1_at_start_up = engine.costs.target.steady(1)
    engine.target.slowdown = 2.0
    for _ in range(2):  # two turns: the second reuses the first's cache
        stats = engine.complete(PROMPT, chat=False, sampling=GREEDY, max_tokens=24).stats
        assert stats.drafted == 0
        # a baseline taken at start-up would read 0.50x here ...
        assert stats.tokens_per_second * t1_at_start_up == pytest.approx(0.5, rel=1e-9)
        # ... the same-moment one reads what happened: nothing was sped up
        assert stats.speedup.ratio == 1.0
        assert stats.to_dict()["speedup"] == {
            "ratio": 1.0, "basis": "measured", "samples": 24,
            "target_only_tokens_per_second": round(stats.tokens_per_second, 3),
            "target_only_seconds": round(stats.decode_time, 4)}


def test_the_server_metrics_sum_the_generations_seconds():
    engine = engine_on_clock([], drafter="none")
    metrics = Metrics()
    stats = engine.complete(PROMPT, chat=False, sampling=GREEDY, max_tokens=12).stats
    metrics.count_generation("completed", stats, 1.0)
    spec = mixed_stats(plain=10, spec=[(8, 8)], t1=0.04)
    metrics.count_generation("completed", spec, 1.0)
    metrics.count_generation("cancelled", Stats(), 0.1)  # no round: no figure, not counted
    snap = metrics.snapshot(queue_depth=0, queue_capacity=4, busy=False)
    both = stats.speedup.target_only_seconds + spec.speedup.target_only_seconds
    seconds = stats.decode_time + spec.decode_time
    assert snap["speedup"]["ratio"] == round(both / seconds, 4)
    assert snap["speedup"]["generations"] == {"measured": 2, "curve": 0}
    text = prometheus_text(snap)
    assert f"edgespec_speedup {round(both / seconds, 4)}" in text
    assert 'edgespec_speedup_generations_total{basis="measured"} 2' in text
    json.dumps(snap)
    empty = Metrics().snapshot(queue_depth=0, queue_capacity=4, busy=False)
    assert empty["speedup"]["ratio"] is None and "edgespec_speedup NaN" in prometheus_text(empty)
