"""The cost model and the auto drafter's choice: pure arithmetic on hand-made costs, and the
policy played against virtual devices (a CPU's linear curve, a GPU's graph per width)."""

import dataclasses
import math

import numpy as np
import pytest

from edgespec.core.costs import (
    CallCosts,
    CostCurve,
    break_even_acceptance,
    expected_tokens,
    expected_tokens_upto,
)
from edgespec.core.policy import (
    DEFAULT_CONFIG,
    AcceptanceEstimate,
    CostEstimate,
    Offer,
    Policy,
    PolicyConfig,
    Realized,
    RoundOutcome,
)
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.calibration import (
    measure_draft_cost,
    measure_relations,
    measure_target_curve,
    warm_widths,
)
from edgespec.runtime.drafters import AutoDrafter, Draft, Outcome

from .fakes import FakeLM, Table

# Two machines, in seconds per target call scoring n tokens:
# a small CPU where batches cost almost linearly (this dev machine's exact kernels, measured),
CPU = {1: 0.051, 2: 0.098, 4: 0.190, 8: 0.380, 16: 0.760}
# and a GPU where scoring 16 tokens costs little more than one.
GPU = {1: 0.010, 4: 0.011, 16: 0.014}


def cpu_costs():
    return CallCosts(CostCurve(dict(CPU)))


def gpu_costs(changed=0.0, second=0.0):
    return CallCosts(CostCurve(dict(GPU)), changed, second, graphs=bool(changed or second))


def _lookup_everywhere(policy, alpha):
    """Lookup right with probability ``alpha`` whatever the length of its match."""
    for n in range(1, policy.max_ngram + 1):
        policy.lookup[n] = AcceptanceEstimate(alpha)


# ---- the arithmetic ------------------------------------------------------------------------------


def test_expected_tokens_matches_the_geometric_series():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    a, k = 0.7, 4
    assert expected_tokens(a, k) == pytest.approx(sum(a**i for i in range(k + 1)))
    assert expected_tokens(0.5, 0) == 1.0
    assert np.allclose(expected_tokens_upto(0.7, 6), [expected_tokens(0.7, k) for k in range(1, 7)])


def test_cost_curve_interpolates_extrapolates_and_learns():
    t = CostCurve({1: 1.0, 5: 3.0})
    assert t(1) == 1.0 and t(5) == 3.0
    assert t(3) == pytest.approx(2.0)  # between points
    assert t(9) == pytest.approx(5.0)  # last slope extended
    t.observe(3, 4.0)  # a new point is taken as measured
    assert t(3) == 4.0
    t.observe(1, 2.0)  # a known point moves towards the observation
    assert 1.0 < t(1) < 2.0
    assert CostCurve({4: 2.0})(8) == pytest.approx(4.0)  # one point: proportional
    # A calibration point is one sample: the first real observation weighs as much as it.
    t = CostCurve({1: 1.0})
    t.observe(1, 1.8)
    assert t(1) == pytest.approx(1.4)
    t.observe(1, 1.8)
    assert t(1) == pytest.approx(1.4 + 0.4 / 3)
    # A stalled call counts as at most twice what the curve says, at a new point too; a fast
    # one as measured (the curve was pessimistic).
    t = CostCurve({1: 1.0, 5: 3.0})
    t.observe(3, 40.0)
    assert t(3) == pytest.approx(4.0)
    t.observe(1, 0.2)
    assert t(1) == pytest.approx((1.0 + 0.2) / 2)
    with pytest.raises(ValueError):
        CostCurve({})


def test_a_point_added_next_to_the_last_does_not_bend_the_curve_beyond_it():
    """Beyond the last point the line runs from the last point at or below half of it: a
    17-token call observed next to 16 must not tilt the extension to 33."""
    cpu = {1: 0.054, 4: 0.171, 16: 0.624}
    t = CostCurve(dict(cpu))
    assert t(33) == pytest.approx(0.624 + 17 * (0.624 - 0.171) / 12)  # the calibration's line
    t.observe(17, 0.96 * 0.624)
    assert t(33) > 0.85 * CostCurve(cpu)(33)
    assert np.allclose(t.table(40)[1:], [t(n) for n in range(1, 41)], rtol=1e-12)


def test_an_observation_is_not_clamped_to_a_curve_that_says_longer_is_cheaper():
    t = CostCurve({1: 0.05, 4: 0.17, 16: 0.6, 32: 0.2})  # a bad point at 32
    assert t(33) < 0.2  # the curve says 33 tokens cost less than 16
    t.observe(33, 1.3)
    assert t(33) == pytest.approx(2 * 0.6)  # capped on the dearest shorter point
    t.observe(32, 1.25)
    assert t(32) == pytest.approx(0.2 + (2 * 0.6 - 0.2) / 2)


def test_a_fixed_width_curve_is_a_staircase_of_one_price():
    t = CostCurve({1: 0.0030, 4: 0.0028, 8: 0.0058}, width=4)
    assert t.points == {4: pytest.approx(0.0029)}  # the median price per call
    assert t(1) == t(4) == pytest.approx(0.0029)
    assert t(5) == t(8) == pytest.approx(2 * 0.0029) and t(9) == pytest.approx(3 * 0.0029)
    t.observe(8, 2 * 0.0039)  # a two-call round at 3.9 ms a call: blended as one price
    assert t(1) == pytest.approx(0.0029 + 0.25 * 0.001)


def test_break_even_acceptance():
    linear = {1: 1.0, 8: 8.0}
    assert break_even_acceptance(linear, 3, draft_cost=0.1) == math.inf
    assert break_even_acceptance({1: 1.0, 16: 1.0}, 4) < 1e-6
    a = break_even_acceptance({1: 1.0, 3: 2.0}, 2)
    assert expected_tokens(a, 2) == pytest.approx(2.0, rel=1e-6)


def test_acceptance_estimate_is_the_geometric_mle_with_a_prior():
    est = AcceptanceEstimate(prior=0.5, prior_weight=0.0)
    est.update(3, True)  # 3 accepted then a rejection
    assert est.alpha == pytest.approx(0.75)
    est = AcceptanceEstimate(prior=0.6)
    assert est.alpha == pytest.approx(0.6)
    for _ in range(200):
        est.update(9, True)
    assert est.alpha == pytest.approx(0.9, abs=0.01)  # the prior is forgotten
    fresh = AcceptanceEstimate(prior=0.7)
    fresh.update(4, True)
    fresh.forget()
    assert fresh.alpha == 0.7


# ---- a call's cost given the calls before it ------------------------------------------------------


def test_call_costs_are_steady_plus_the_excess_of_the_calls_relation():
    costs = gpu_costs(changed=3e-3, second=5e-3)
    assert costs(4, 4, 2) == pytest.approx(GPU[4])  # settled: a replayed graph
    assert costs(4, 4, 1) == pytest.approx(GPU[4] + 5e-3)  # the second: the capture
    assert costs(4, 1, 9) == pytest.approx(GPU[4] + 3e-3)  # a new width: no graph
    assert costs(1, None, 0) == pytest.approx(GPU[1] + 3e-3)  # after the prefill
    assert costs.excess(4, 1, 9) == 3e-3 and costs.excess(4, 4, 1) == 5e-3 and costs.excess(4, 4, 2) == 0.0
    # without graphs (a CPU, a fixed width) a call costs its width's steady time, whatever
    assert cpu_costs()(4, 1, 1) == CPU[4] and cpu_costs().excess(4, 1, 1) == 0.0


def test_call_costs_learn_each_relation_from_its_own_calls():
    costs = gpu_costs(changed=3e-3, second=5e-3)
    costs.observe(4, 4, 2, 0.020)  # settled: S(4) moves
    assert costs.steady(4) == pytest.approx((0.011 + 0.020) / 2)
    s4 = costs.steady(4)
    costs.observe(4, 1, 5, s4 + 8e-3)  # a new width: U moves towards 8 ms, S does not
    assert costs.changed == pytest.approx(3e-3 + 0.2 * 5e-3) and costs.steady(4) == s4
    costs.observe(4, 4, 1, s4 + 1e-3)  # the second: C moves towards 1 ms
    assert costs.second == pytest.approx(5e-3 - 0.2 * 4e-3)
    costs.observe(1, 4, 2, 10.0)  # a stalled call counts as at most twice its estimate
    assert costs.changed <= 3e-3 + 0.2 * 5e-3 + 0.2 * 2 * 0.010
    cpu = cpu_costs()
    cpu.observe(4, 1, 1, 0.3)  # no graphs: every call is the steady curve's sample
    assert cpu.steady(4) > CPU[4] and cpu.changed == cpu.second == 0.0
    fixed = CallCosts(CostCurve({8: 0.004}, width=8))
    assert fixed.shape(3) == 8 and fixed.shape(9) == 8 and cpu.shape(9) == 9


# ---- measuring a backend ------------------------------------------------------------------------


class _GraphDevice(FakeLM):
    """A fake whose calls take virtual time as on a GPU with one graph per width: S(n) for a
    replayed call (the third of its width in a row on), U more for a new width, C more for
    the second; the time goes on a clock the calibration reads."""

    def __init__(self, clock, steady, changed, second, **kw):
        super().__init__(Table(50, seed=1), n_ctx=128, **kw)
        self.clock, self.steady, self.changed, self.second = clock, steady, changed, second
        self.last, self.run = None, 0
        self.widths: list[int] = []

    def decode(self, tokens, n_logits):
        n = len(tokens)
        if n_logits:
            self.widths.append(n)
        extra = (self.changed if n != self.last else self.second if self.run == 1 else 0.0)
        self.clock.now += self.steady(n) + extra
        self.last, self.run = n, (self.run + 1 if n == self.last else 1)
        return super().decode(tokens, n_logits)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_measure_relations_recovers_steady_costs_and_both_excesses(monkeypatch):
    from edgespec.runtime import calibration

    clock = _Clock()
    monkeypatch.setattr(calibration, "time", clock)
    device = _GraphDevice(clock, lambda n: 2e-3 + 1e-4 * n, changed=1.5e-3, second=4e-3)
    steady, changed, second = measure_relations(device, (1, 4, 16), repeats=2)
    assert steady == {n: pytest.approx(2e-3 + 1e-4 * n) for n in (1, 4, 16)}
    assert changed == pytest.approx(1.5e-3) and second == pytest.approx(4e-3)
    assert device.widths == [2, 1, 1, 1, 4, 4, 4, 16, 16, 16] * 2  # each after another width
    # one width over several passes: each pass still starts after another width
    device = _GraphDevice(clock, lambda n: 2e-3, changed=1.5e-3, second=4e-3)
    assert measure_relations(device, (4,), repeats=3)[1:] == (pytest.approx(1.5e-3),
                                                               pytest.approx(4e-3))
    # a budget ends it after the first pass, never within it
    device = _GraphDevice(clock, lambda n: 2e-3, changed=1e-3, second=1e-3)
    measure_relations(device, (1, 4), repeats=5, budget_s=0.0)
    assert device.widths == [2, 1, 1, 1, 4, 4, 4]


def test_measure_target_curve_on_a_fake_leaves_a_usable_cache():
    lm = FakeLM(Table(50, seed=1), n_ctx=64)
    curve = measure_target_curve(lm, (1, 16, 4), budget_s=10.0)
    assert set(curve) == {1, 16, 4} and all(v > 0 for v in curve.values())
    assert len(lm.tokens) <= lm.n_ctx
    lm.sync([])
    assert lm.tokens == []


def test_warm_widths_makes_one_call_of_each_width_that_fits_reading_every_row():
    lm = FakeLM(Table(50, seed=1), n_ctx=40)
    assert warm_widths(lm, [3, 1, 3, 2, 41], context=32) == [3, 1, 2]  # 41 cannot fit at all
    reading = [(len(c.tokens), c.n_logits) for c in lm.calls if c.n_logits]
    assert reading == [(3, 3), (1, 1), (2, 2)]
    assert all(c.pos == 32 for c in lm.calls if c.n_logits)  # each after the same context


def test_calibration_repeats_interleave_the_points_and_stop_at_the_budget(monkeypatch):
    from edgespec.runtime import calibration

    clock = _Clock()
    monkeypatch.setattr(calibration, "time", clock)
    lm = _GraphDevice(clock, lambda n: 1e-3, 0.0, 0.0)
    assert set(measure_target_curve(lm, (1, 4, 2), repeats=3, budget_s=10.0)) == {1, 4, 2}
    assert lm.widths == [1] + [1, 4, 2] * 3  # a warm-up, then three passes in the given order
    lm = _GraphDevice(clock, lambda n: 1e-3, 0.0, 0.0)
    measure_target_curve(lm, (1, 4, 2), repeats=3, budget_s=0.0)
    assert lm.widths == [1, 1]  # the budget spent: the first point only, measured once
    lm = _GraphDevice(clock, lambda n: 1e-3, 0.0, 0.0)
    assert measure_draft_cost(lm, n=3, repeats=4, budget_s=10.0) == pytest.approx(1e-3)
    assert lm.widths == [1] * (1 + 4 * 3)  # a warm-up, then four runs of three tokens
    lm = _GraphDevice(clock, lambda n: 1e-3, 0.0, 0.0)
    measure_draft_cost(lm, n=3, repeats=4, budget_s=0.0)
    assert lm.widths == [1] * (1 + 3)  # no room for a second run


# ---- the choice ---------------------------------------------------------------------------------


def test_cpu_costs_choose_plain_decoding_unless_lookup_is_nearly_certain():
    policy = Policy(cpu_costs(), CostEstimate(0.035))
    choice = policy.choose(Offer(32, lookup_len=10, ngram=2))
    assert (choice.source, choice.k) == ("none", 0)
    assert not policy.model_can_pay(32)  # 35 ms per draft token cannot beat 51 ms per step
    for _ in range(100):  # lookup that is always right
        policy.observe_lookup(4, 10, False)
    choice = policy.choose(Offer(32, lookup_len=10, ngram=4))
    assert choice.source == "lookup" and choice.rate > choice.baseline


def test_gpu_costs_draft_long_and_prefer_the_better_source():
    policy = Policy(gpu_costs(), CostEstimate(0.002))
    choice = policy.choose(Offer(16))
    assert choice.source == "model" and choice.k >= 2
    assert choice.rate > choice.baseline
    for _ in range(50):
        policy.model.update(1, True)  # the model is mostly wrong on this text
        policy.observe_lookup(4, 12, True)  # lookup copies long runs
    choice = policy.choose(Offer(16, lookup_len=12, ngram=4))
    assert choice.source == "lookup" and choice.k >= 8
    assert policy.choose(Offer(5, lookup_len=12, ngram=4)).k <= 5  # never more than the cap
    short = policy.choose(Offer(16, lookup_len=3, ngram=4))
    assert short.source != "lookup" or short.k <= 3  # nor than the match offers
    assert policy.choose(Offer(0, lookup_len=5, ngram=4)).k == 0  # a cap of 0: a plain step


def test_the_choice_is_the_models_formula_written_out():
    """choose, against rate(s, k) = E / (S(w) + c + A(w) / R + B / L) written as a loop over
    k for random states of the estimates and the calls before (numpy's arrays and the loop
    agree to the last bits; the hysteresis as the docstring states it)."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        policy, offer = _random_state(rng)
        got = policy.choose(offer)
        want = _choice_by_loop(policy, offer)
        assert (got.source, got.k) == want[:2]
        assert got.rate == pytest.approx(want[2], rel=1e-9)


def _choice_by_loop(policy, offer):
    costs, cfg = policy.costs, policy.config
    last, run, last_source = policy.last_width, policy.run, policy._last_source

    def length(est):
        return 1.0 / (1.0 - min(est.alpha, 1.0 - 1.0 / cfg.max_stretch))

    def once(source, w):
        if not costs.graphs:
            return 0.0
        r = length(policy.hold[source])
        if w != last:
            a = costs.changed + (1.0 - 1.0 / r) * costs.second
        else:
            a = costs.second if run == 1 else 0.0
        out = a / r
        if source != "none" and last_source in (None, "none"):
            out += (costs.changed + costs.second) / length(policy.stretch[source])
        return out

    plain = 1.0 / (costs.steady(1) + once("none", 1))
    options = []
    n_lookup = min(offer.k_max, offer.lookup_len) if policy.realized.allowed("lookup") else 0
    for k in range(1, n_lookup + 1):
        e = float(policy.lookup_expected(offer.ngram, k)[-1])
        options.append(("lookup", k, e / (costs.steady(k + 1) + policy.lookup_cost.seconds
                                          + once("lookup", k + 1))))
    if policy.draft_cost is not None and offer.model and policy.realized.allowed("model"):
        a = policy.model.alpha
        d = policy.draft_cost.seconds
        first = (d * max(costs.steady(offer.behind) / costs.steady(1), 1.0)
                 if offer.wide and offer.behind > 1 else d * max(offer.behind, 1))
        for k in range(1, offer.k_max + 1):
            options.append(("model", k, expected_tokens(a, k)
                            / (costs.steady(k + 1) + d * (k - 1) + first + once("model", k + 1))))
    best = ("none", 0, plain)
    for option in options:  # (the shorter draft on ties, as argmax takes the first)
        if option[2] > best[2]:
            best = option
    incumbent = ("none", 0, plain)
    for option in options:
        if (costs.graphs and option[0] == last_source and last is not None
                and option[1] == last - 1):
            incumbent = option
    if best[:2] == incumbent[:2]:
        return best
    return best if best[2] > incumbent[2] * (1 + cfg.margin) else incumbent


def _random_state(rng):
    graphs = bool(rng.random() < 0.7)
    costs = CallCosts(CostCurve({1: 2e-3, 4: 2.6e-3, 16: 3.4e-3, 33: 5e-3}),
                      float(rng.uniform(0, 6e-3)) if graphs else 0.0,
                      float(rng.uniform(0, 9e-3)) if graphs else 0.0, graphs=graphs)
    policy = Policy(costs, CostEstimate(float(rng.uniform(0.2e-3, 2e-3))))
    for n in range(1, policy.max_ngram + 1):
        policy.lookup[n] = AcceptanceEstimate(float(rng.uniform(0.2, 0.99)))
    policy.model = AcceptanceEstimate(float(rng.uniform(0.2, 0.95)),
                                      successes=float(rng.uniform(0, 20)),
                                      failures=float(rng.uniform(0, 5)))
    for source in ("none", "lookup", "model"):
        policy.stretch[source] = AcceptanceEstimate(float(rng.uniform(0, 0.99)))
        policy.hold[source] = AcceptanceEstimate(float(rng.uniform(0, 0.99)))
    policy._last_source = str(rng.choice(["none", "lookup", "model"]))
    policy.last_width = 1 if policy._last_source == "none" else int(rng.integers(2, 34))
    policy.run = int(rng.integers(1, 5))
    offer = Offer(int(rng.integers(1, 33)), lookup_len=int(rng.integers(0, 33)),
                  ngram=int(rng.integers(1, 9)), model=bool(rng.random() < 0.8),
                  behind=int(rng.integers(1, 20)), wide=bool(rng.random() < 0.5))
    return policy, offer


def test_a_lone_round_from_plain_decoding_pays_its_way_in_and_back():
    """On a GPU with a graph per width, a lookup round from steady plain decoding costs U now
    and U + C on the way back (its own capture only if it goes on): a modest offer that would
    pay at the steady cost does not, once lookup's rounds are known not to go on; inside a
    stretch of lookup rounds at its width, the same offer is taken."""
    policy = Policy(gpu_costs(changed=3e-3, second=6e-3))
    _lookup_everywhere(policy, 0.6)
    policy.last_width, policy.run, policy._last_source = 1, 5, "none"
    offer = Offer(16, lookup_len=3, ngram=8)
    steady = Policy(gpu_costs())
    _lookup_everywhere(steady, 0.6)
    steady.last_width, steady.run, steady._last_source = 1, 5, "none"
    assert steady.choose(offer).source == "lookup"  # without the graph costs it pays
    assert policy.choose(offer).source == "none"
    policy.last_width, policy.run, policy._last_source = 4, 3, "lookup"  # a settled stretch
    policy.stretch["lookup"] = AcceptanceEstimate(0.9)
    policy.hold["lookup"] = AcceptanceEstimate(0.9)
    assert (policy.choose(offer).source, policy.choose(offer).k) == ("lookup", 3)


@pytest.mark.parametrize("graphs", [True, False])
def test_what_the_last_round_played_stays_unless_another_choice_promises_the_margin(graphs):
    """With graphs a change of width costs, so the width stays unless another promises the
    margin; without, it costs nothing and the width follows the best rating (a kept width
    would lock in whatever noise once rated best)."""
    policy = Policy(gpu_costs(), CostEstimate(1e-3))
    policy.costs.graphs = graphs  # (same rates: U = C = 0, only the hold differs)
    policy.model = AcceptanceEstimate(0.8, successes=40, failures=10)
    first = policy.choose(Offer(8))
    assert first.source == "model"
    policy.last_width, policy.run, policy._last_source = first.k + 1, 3, "model"
    # nudge the estimate so that another k is best by less than the margin
    policy.model = AcceptanceEstimate(0.8, successes=44, failures=10)
    rates = policy._rates("model", expected_tokens_upto(policy.model.alpha, 8),
                          policy.model_drafting(8))
    best = int(rates.argmax()) + 1
    assert best != first.k
    assert rates.max() <= rates[first.k - 1] * (1 + policy.config.margin)
    assert policy.choose(Offer(8)).k == (first.k if graphs else best)


def test_a_fixed_width_drafts_to_fill_the_calls():
    policy = Policy(CallCosts(CostCurve({8: 0.0028}, width=8)), CostEstimate(0.0005))
    for _ in range(30):
        policy.observe_lookup(4, 8, False)
    choice = policy.choose(Offer(32, lookup_len=32, ngram=4))
    assert choice.source == "lookup" and choice.k >= 7 and (choice.k + 1) % 8 == 0


def test_the_draft_model_pays_for_what_it_must_read_first():
    policy = Policy(gpu_costs(), CostEstimate(1e-3))
    in_step = policy.model_drafting(4)
    assert np.allclose(in_step, [1e-3, 2e-3, 3e-3, 4e-3])
    assert np.allclose(policy.model_drafting(4, behind=3), in_step + 2e-3)  # a call each
    wide = policy.model_drafting(4, behind=16, wide=True)  # one call, priced by S's shape
    assert np.allclose(wide, in_step + 1e-3 * (GPU[16] / GPU[1] - 1.0))


def test_at_small_draft_cost_auto_drafts_with_the_model_from_steady_plain_decoding():
    """The x15 cost twin of the default target on an H200 (2026-11-28): S(1) 29.5 ms, S(5)
    ~45, U ~60 ms, C ~35, a 1.27 ms draft token. Entering a model stretch costs 2 (U + C), ~6
    plain steps, spread over its expected length: at the model's prior it pays from steady
    plain decoding (the policy before charged it three switch penalties on a single round
    and never drafted there: 0.97x of plain decoding where the model drafter ran 2.1x)."""
    costs = CallCosts(CostCurve({1: 0.0295, 4: 0.0421, 8: 0.0549, 16: 0.0690, 32: 0.0844}),
                      0.060, 0.035, graphs=True)
    policy = Policy(costs, CostEstimate(0.00127))
    policy.last_width, policy.run, policy._last_source = 1, 9, "none"
    choice = policy.choose(Offer(32))
    assert choice.source == "model" and choice.rate > 1.1 * choice.baseline
    # a lone round (known not to go on) would not pay: it is the stretch that does
    policy.stretch["model"] = AcceptanceEstimate(0.0, prior_weight=100)
    policy.hold["model"] = AcceptanceEstimate(0.0, prior_weight=100)
    assert policy.choose(Offer(32)).source == "none"


def test_observe_learns_calls_acceptance_and_stretches():
    policy = Policy(gpu_costs(changed=3e-3, second=5e-3), CostEstimate(1e-3))
    policy.observe(RoundOutcome("none", 1, 0, 0, 1, 0.016, 0.0))  # after the prefill: U
    assert policy.costs.changed > 3e-3 and (policy.last_width, policy.run) == (1, 1)
    hold_before = policy.hold["none"].alpha
    policy.observe(RoundOutcome("none", 1, 0, 0, 1, 0.010, 0.0))
    assert policy.hold["none"].alpha > hold_before  # plain followed plain at its width
    policy.observe(RoundOutcome("model", 5, 4, 4, 5, 0.013, 0.004, draft_step=1.2e-3))
    assert policy.model.successes == 4 and policy.model.failures == 0
    assert policy.draft_cost.seconds == pytest.approx(1e-3 + 0.2 * 0.2e-3)
    assert policy.stretch["none"].failures > 0  # plain's stretch ended
    policy.observe(RoundOutcome("model", 3, 2, 1, 2, 0.012, 0.002))
    assert policy.stretch["model"].successes > 0 and policy.hold["model"].failures > 0
    policy.observe(RoundOutcome("none", 1, 0, 0, 1, 0.01, 0.0, lookup=(3, 2, True)))
    assert policy.lookup[3].successes == 1 and policy.lookup[5].failures == 1


def test_the_draft_models_acceptance_is_forgotten_after_it_sat_out_a_while():
    """A re-trial: after ``retrial_wait[0]`` rounds without the model its acceptance (and how
    its stretches went) is back at the prior; the next wait is twice as long, up to the
    second number, and back to the first once a model round keeps every draft."""
    cfg = PolicyConfig(retrial_wait=(3, 8))
    policy = Policy(gpu_costs(), CostEstimate(1e-3), cfg)
    policy.observe(RoundOutcome("model", 5, 4, 0, 1, 0.013, 0.004))
    low = policy.model.alpha
    assert low < cfg.model_prior
    plain = RoundOutcome("none", 1, 0, 0, 1, 0.010, 0.0)
    for _ in range(2):
        policy.observe(plain)
    assert policy.model.alpha == low
    policy.observe(plain)
    assert policy.model.alpha == cfg.model_prior and policy._wait == 6
    policy.observe(RoundOutcome("model", 5, 4, 1, 2, 0.013, 0.004))
    for _ in range(5):
        policy.observe(plain)
    assert policy.model.alpha < cfg.model_prior
    policy.observe(plain)
    assert policy.model.alpha == cfg.model_prior and policy._wait == 8
    policy.observe(RoundOutcome("model", 5, 4, 4, 5, 0.013, 0.004))
    assert policy._wait == 3


# ---- lookup's chain of estimates ---------------------------------------------------------------


def test_a_lookup_draft_is_rated_as_a_chain_of_longer_and_longer_matches():
    policy = Policy(gpu_costs(), max_ngram=4)
    _lookup_everywhere(policy, 0.8)  # one alpha everywhere: the geometric series
    assert np.allclose(policy.lookup_expected(2, 10), expected_tokens_upto(0.8, 10))
    policy.lookup[3], policy.lookup[4] = AcceptanceEstimate(0.5), AcceptanceEstimate(0.9)
    assert np.allclose(policy.lookup_expected(3, 4),
                       [1.5, 1.5 + 0.45, 1.95 + 0.405, 2.355 + 0.3645])
    # a match longer than the cap is its own cap: its estimate all the way
    assert np.allclose(policy.lookup_expected(6, 3), expected_tokens_upto(0.7, 3))


def test_lookup_evidence_goes_to_the_match_size_each_token_was_drafted_at():
    policy = Policy(gpu_costs())
    policy.observe_lookup(3, 7, True)
    seen = {n: (e.successes, e.failures) for n, e in policy.lookup.items()}
    assert seen == {3: (1, 0), 4: (1, 0), 5: (1, 0), 6: (1, 0), 7: (1, 0), 8: (2, 1)}
    policy = Policy(gpu_costs())
    policy.observe_lookup(3, 2, True)
    seen = {n: (e.successes, e.failures) for n, e in policy.lookup.items()}
    assert seen == {3: (1, 0), 4: (1, 0), 5: (0, 1)}
    policy.observe_lookup(8, 20, False)  # a sure copy at the cap: one update of 20
    assert (policy.lookup[8].successes, policy.lookup[8].failures) == (20, 0)


def test_the_chain_recovers_a_copy_that_firms_up_as_it_goes():
    """Shadow comparisons from a process where a young match (under 5 tokens) is right 60% of
    the time and a grown one 99%: the chain's expected tokens for a 16-token draft from a
    2-token match land near the truth (4.8). With forgetting at 0.95 each young size has ~20
    effective observations (~0.11 of noise each, ~20% over a product of three): the median
    error over 20 seeds must stay under 25%, and one estimate for the whole draft (a bias of
    ~48%) must be at least twice as far off."""
    chain_err, single_err = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        policy = Policy(gpu_costs())
        size = 2
        for _ in range(600):
            if rng.random() < (0.6 if size < 5 else 0.99):
                policy.observe_lookup(size, 1, False)
                size = min(size + 1, policy.max_ngram)
            else:
                policy.observe_lookup(size, 0, True)
                size = 2
        truth, reached = 1.0, 1.0
        for i in range(16):
            reached *= 0.6 if min(2 + i, policy.max_ngram) < 5 else 0.99
            truth += reached
        chain = float(policy.lookup_expected(2, 16)[-1])
        single = expected_tokens(policy.lookup_estimate(2).alpha, 16)
        chain_err.append(abs(chain - truth) / truth)
        single_err.append(abs(single - truth) / truth)
    assert np.median(chain_err) < 0.25
    assert np.median(single_err) > 2 * np.median(chain_err)


# ---- plain steps assured: derived from the choice --------------------------------------------


def test_an_assured_plain_step_is_what_every_offer_gets_after_one_more_plain_step():
    """plain_assured(k_max, moved) says the round after the next plain step is plain, for any
    lookup offer and the draft model in step. Checked against choose itself over 2,000 random
    states: after the plain step is observed (its shadow's n-gram size won, lost, or nothing),
    every offer of every match size and length, and none, is declined."""
    rng = np.random.default_rng(11)
    said = {True: 0, False: 0}
    for _ in range(2000):
        policy, offer = _random_state(rng)
        policy.lookup_cost = CostEstimate(float(rng.uniform(0, 3e-4)))
        moved = int(rng.integers(0, policy.max_ngram + 1))
        assured = policy.plain_assured(offer.k_max, moved=moved)
        said[assured] += 1
        if not assured:
            continue
        for shadow in ((moved, 1, False), (moved, 0, True), None):
            after = _copy_policy(policy)
            after.observe(RoundOutcome("none", 1, 0, 0, 1, after.costs.steady(1), 0.0,
                                       lookup=shadow if moved else None))
            after.lookup_cost = CostEstimate(0.0)
            for ngram in range(1, policy.max_ngram + 1):
                for n in (1, offer.k_max // 2, offer.k_max):
                    choice = after.choose(Offer(offer.k_max, n, ngram))
                    assert choice.source == "none", (ngram, n, choice)
            assert after.choose(Offer(offer.k_max)).source == "none"
    assert said[True] >= 100 and said[False] >= 100  # (both answers are exercised)


def _copy_policy(policy):
    import copy

    copied = copy.deepcopy(policy)
    copied.costs = copy.deepcopy(policy.costs)
    return copied


# ---- what each source delivered --------------------------------------------------------------


def test_realized_rates_set_a_losing_source_aside_and_charge_it_the_dearer_plain_steps():
    first, _ = DEFAULT_CONFIG.guard_ban
    r = Realized(plain_prior=2.0e-3)
    for _ in range(10):
        r.record("none", 1, 2.0e-3)  # steady plain steps: 500 tokens/s
    assert r.steady_plain() == pytest.approx(2.0e-3)
    # lookup rounds of 2 tokens in 3 ms look fine alone, but each makes the next two plain
    # steps 2.4 ms dearer: 2 tokens in 7.8 ms (256/s), judged once enough is seen
    rounds = 0
    while r.allowed("lookup"):
        r.record("lookup", 2, 3.0e-3)
        r.record("none", 1, 4.4e-3)
        r.record("none", 1, 4.4e-3)
        rounds += 1
        assert rounds < 50
    assert 7 <= rounds <= 10  # judged on its time (3.9 plain steps a round), not sooner
    assert r.steady_plain() == pytest.approx(2.0e-3)  # the extra went to lookup, not plain
    assert r.ban["lookup"] == first
    for _ in range(r.banned_until["lookup"] - r.round - 1):
        r.record("none", 1, 2.0e-3)
    assert not r.allowed("lookup")
    r.record("none", 1, 2.0e-3)
    assert r.allowed("lookup")
    while r.allowed("lookup"):  # losing again: twice as long
        r.record("lookup", 2, 3.0e-3)
        r.record("none", 1, 4.4e-3)
        r.record("none", 1, 4.4e-3)
    assert r.ban["lookup"] == 2 * first
    for _ in range(200):
        r.record("model", 4, 4.0e-3)  # a source that pays is never set aside
    assert r.allowed("model")


def test_long_drafts_that_fail_are_set_aside_on_their_time_not_their_tokens():
    first, _ = DEFAULT_CONFIG.guard_ban
    r = Realized(plain_prior=0.05)
    for _ in range(10):
        r.record("none", 1, 0.05)  # a CPU's plain step: 20 tokens/s
    r.record("lookup", 1, 1.1)  # 33 tokens scored, 1 committed: the time of 22 plain steps
    assert r.allowed("lookup")
    r.record("none", 1, 0.05)
    r.record("lookup", 1, 1.1)
    assert not r.allowed("lookup") and r.ban["lookup"] == first
    for _ in range(5):  # a 32-token draft that was right all along
        r.record("model", 33, 1.1)
    assert r.allowed("model")


def test_a_ban_is_cleared_only_on_a_settled_record():
    first, _ = DEFAULT_CONFIG.guard_ban
    r = Realized(plain_prior=2.0e-3)
    for _ in range(10):
        r.record("none", 1, 2.0e-3)
    while r.allowed("lookup"):
        r.record("lookup", 2, 3.0e-3)
        r.record("none", 1, 4.4e-3)
        r.record("none", 1, 4.4e-3)
    assert r.ban["lookup"] == first
    while not r.allowed("lookup"):
        r.record("none", 1, 2.0e-3)
    for _ in range(8):  # paying rounds, before their dearer plain steps are charged
        r.record("lookup", 4, 6.8e-3)
        assert r.ban["lookup"] == first
    assert r.sources["lookup"].tokens >= DEFAULT_CONFIG.guard_evidence
    r.record("none", 1, 8.0e-3)
    r.record("none", 1, 8.0e-3)
    assert not r.allowed("lookup") and r.ban["lookup"] == 2 * first


# ---- auto on virtual devices -------------------------------------------------------------------


class _OfferingLookup:
    """A stand-in lookup offering a ``length``-token draft in a fraction ``p_offer`` of rounds,
    from a match at the longest n-gram size (one estimate rates all of its tokens)."""

    max_ngram = 8

    def __init__(self, rng, p_offer, length):
        self.rng, self.p_offer, self.length = rng, p_offer, length

    def propose(self, context, k, params, rng):
        if self.rng.random() < self.p_offer:
            return Draft([7] * self.length, [None] * self.length, "lookup", self.max_ngram)
        return Draft(source="lookup")


def _virtual_rate(p_offer, alpha, rounds=3000, seed=0, hidden=0.0, length=6,
                  config=DEFAULT_CONFIG):
    """Tokens per virtual second of auto on a GPU-like device (S(n) 2 ms + 0.1 ms a token, a
    new width 2.4 ms more, its second call 3 ms more), with lookup drafts of ``length`` tokens
    offered in a fraction of rounds, each drafted token right with probability ``alpha``;
    ``hidden``: seconds every drafting round costs that no estimate is told of."""
    def steady(n):
        return 2.0e-3 + 0.1e-3 * (n - 1)

    device = CallCosts(CostCurve({n: steady(n) for n in (1, 4, 8, 16, 32)}), 2.4e-3, 3e-3,
                       graphs=True)
    policy = Policy(CallCosts(CostCurve({n: steady(n) for n in (1, 4, 8, 16, 32)}), 2.4e-3,
                              3e-3, graphs=True), config=config)
    rng = np.random.default_rng(seed)
    auto = AutoDrafter(policy, _OfferingLookup(rng, p_offer, length))
    params = SamplingParams(temperature=0)
    elapsed = tokens = 0.0
    last, run = None, 0
    for _ in range(rounds):
        draft = auto.propose([], 32, params, None)
        shadow = auto._shadow.tokens
        right = 0
        while right < len(shadow) and rng.random() < alpha:
            right += 1
        drafted = len(draft.tokens) if draft.source == "lookup" else 0
        accepted = min(right, drafted)
        new = [7] * accepted + [7 if right > accepted else 8]
        seconds = device(drafted + 1, last, run)
        last, run = drafted + 1, (run + 1 if drafted + 1 == last else 1)
        stall = hidden if drafted else 0.0
        auto.observe(Outcome(draft, drafted, accepted, new, stall, seconds))
        elapsed += seconds + stall
        tokens += len(new)
    return tokens / elapsed


def test_on_a_gpu_auto_skips_lone_drafts_and_drafts_in_stretches():
    """Lookup offers 6 tokens in 30% of rounds, right 70% a token: lone rounds, each paying its
    way in and back, lose; auto must stay within 5% of plain decoding (with the guard off: the
    choice alone). Offered every round and nearly always right, the rounds keep their width
    and replay graphs: at least 1.5x."""
    plain = 1.0 / 2.0e-3
    no_guard = PolicyConfig(guard_fraction=0.0)
    assert _virtual_rate(0.3, 0.7, config=no_guard) >= 0.95 * plain
    assert _virtual_rate(1.0, 0.95) >= 1.5 * plain


def test_the_realized_check_catches_a_cost_the_estimates_miss():
    """Lookup rounds cost 8 ms more than any estimate says: the choice keeps drafting, the
    record of what drafting delivered sets lookup aside, and auto stays within 5% of plain
    decoding; without the check it loses about a tenth."""
    plain = 1.0 / 2.0e-3
    assert _virtual_rate(0.7, 0.85, hidden=8.0e-3, length=16) >= 0.95 * plain
    assert _virtual_rate(0.7, 0.85, hidden=8.0e-3, length=16,
                         config=PolicyConfig(guard_fraction=0.0)) < 0.92 * plain
