"""The cost model and the auto drafter's choice: pure arithmetic on hand-made cost curves."""

import math

import numpy as np
import pytest

from edgespec.core.costs import (
    CostCurve,
    break_even_acceptance,
    expected_tokens,
    measure_target_curve,
    warm_widths,
)
from edgespec.core.policy import PROBE_SLACK, AcceptanceEstimate, CostEstimate, Policy
from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.runtime.drafters import AutoDrafter, Draft, LookupDrafter, Outcome

from .fakes import FakeLM, Table

# Two machines, in seconds per target call scoring n tokens:
# a small CPU where batches cost almost linearly (this dev machine's exact kernels, measured),
CPU = {1: 0.051, 2: 0.098, 4: 0.190, 8: 0.380, 16: 0.760}
# and a GPU where scoring 16 tokens costs little more than one.
GPU = {1: 0.010, 4: 0.011, 16: 0.014}


def _lookup_everywhere(policy, alpha):
    """Lookup right with probability ``alpha`` whatever the length of its match: every n-gram
    size's estimate at ``alpha`` (a prior with no record), so a draft's chain of estimates
    is the geometric series of a single alpha."""
    for n in range(1, policy.max_ngram + 1):
        policy.lookup[n] = AcceptanceEstimate(alpha)


def test_expected_tokens_matches_the_geometric_series():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    a, k = 0.7, 4
    assert expected_tokens(a, k) == pytest.approx(sum(a**i for i in range(k + 1)))
    assert expected_tokens(0.5, 0) == 1.0


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
    """The loop adds points where it plays, often next to a measured one; the slope between
    two neighbours is noise. A CPU bench's curve (points 1, 4, 16; ~38 ms a token) once saw a
    17-token call at 0.96 t(16), and the last segment's extension made t(33) 0.22 s where
    it is ~1.3 s: auto then played 32-token drafts on every prompt (0.68x of plain decoding on
    one). Beyond the last point the line now runs from the last point at or below half of it
    (the calibration's points are spaced so that this is their last segment)."""
    import numpy as np

    cpu = {1: 0.054, 4: 0.171, 16: 0.624}
    t = CostCurve(dict(cpu))
    assert t(33) == pytest.approx(0.624 + 17 * (0.624 - 0.171) / 12)  # the calibration's line
    t.observe(17, 0.96 * 0.624)
    assert t(33) > 0.85 * CostCurve(cpu)(33)  # was 0.17x
    assert np.allclose(t.table(40)[1:], [t(n) for n in range(1, 41)], rtol=1e-12)
    # The H100's calibration (points up to 33 with 16 below half of it): as before.
    gpu = {1: 2.21e-3, 4: 3.16e-3, 8: 3.39e-3, 16: 4.86e-3, 33: 6.19e-3}
    assert CostCurve(gpu)(40) == pytest.approx(6.19e-3 + 7 * (6.19e-3 - 4.86e-3) / 17)


def test_an_observation_is_not_clamped_to_a_curve_that_says_longer_is_cheaper():
    """A stalled call counts as at most OUTLIER times what the curve says; but where the curve
    says a call costs less than a shorter one did (an extension tilted by noise), that cap
    turned every real observation into twice the curve's own mistake, and the next point
    tilted it further: on a noisy replay of this CPU t(28), t(31), t(33) went 367, 294, 0.01
    ms (truth: over a second). The cap now rests on no less than the dearest shorter point."""
    t = CostCurve({1: 0.05, 4: 0.17, 16: 0.6, 32: 0.2})  # a bad point at 32
    assert t(33) < 0.2  # the curve says 33 tokens cost less than 16
    t.observe(33, 1.3)
    assert t(33) == pytest.approx(2 * 0.6)  # (was 2 x 0.175)
    t.observe(32, 1.25)
    assert t(32) == pytest.approx(0.2 + (2 * 0.6 - 0.2) / 2)  # (was 0.3: 2 x its own 0.2)
    # where the curve rises, the cap is what it was: twice what the curve says
    t = CostCurve({1: 1.0, 5: 3.0})
    t.observe(3, 40.0)
    assert t(3) == pytest.approx(4.0)


def test_break_even_acceptance():
    # Linear costs with no per-call overhead: even perfect drafts cannot pay.
    linear = {1: 1.0, 8: 8.0}
    assert break_even_acceptance(linear, 3, draft_cost=0.1) == math.inf
    # A flat curve: any acceptance pays for free drafts.
    assert break_even_acceptance({1: 1.0, 16: 1.0}, 4) < 1e-6
    # t(k+1) = 2 t(1): the round must emit 2 tokens on average -> 1 + a + a^2 = 2 for k = 2.
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


def test_cpu_costs_choose_plain_decoding_unless_lookup_is_nearly_certain():
    policy = Policy(CostCurve(dict(CPU)), CostEstimate(0.035))
    choice = policy.choose(32, lookup_len=10, lookup_ngram=2)
    assert (choice.source, choice.k) == ("none", 0)
    assert not policy.model_can_pay(32)  # 35 ms per draft token cannot beat 51 ms per step
    for _ in range(100):  # lookup that is always right
        policy.observe_lookup(4, 10, False)
    choice = policy.choose(32, lookup_len=10, lookup_ngram=4)
    assert choice.source == "lookup" and choice.rate > choice.baseline


def test_gpu_costs_draft_long_and_prefer_the_better_source():
    policy = Policy(CostCurve(dict(GPU)), CostEstimate(0.002))
    choice = policy.choose(16)
    assert choice.source == "model" and choice.k >= 2  # prior acceptance 0.6: short drafts
    assert choice.rate > choice.baseline
    for _ in range(50):
        policy.model.update(1, True)  # the model is mostly wrong on this text
        policy.observe_lookup(4, 12, True)  # lookup copies long runs
    choice = policy.choose(16, lookup_len=12, lookup_ngram=4)
    assert choice.source == "lookup" and choice.k >= 8
    # Never more than the match offers, nor than the cap.
    assert policy.choose(5, lookup_len=12, lookup_ngram=4).k <= 5
    short = policy.choose(16, lookup_len=3, lookup_ngram=4)
    assert short.source != "lookup" or short.k <= 3


def test_a_cap_of_zero_is_a_plain_step():
    policy = Policy(CostCurve(dict(GPU)), CostEstimate(0.001))
    assert policy.choose(0, lookup_len=5, lookup_ngram=4).k == 0


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
    lm.sync([])
    assert lm.tokens == []


def test_a_probe_plays_the_best_other_lookup_length_that_loses_little():
    policy = Policy(CostCurve(dict(CPU)), CostEstimate(0.035))
    _lookup_everywhere(policy, 0.8)  # loses narrowly on this CPU
    assert policy.choose(32, lookup_len=10, lookup_ngram=2).k == 0
    probe = policy.choose(32, lookup_len=10, lookup_ngram=2, probe=True)
    assert probe.source == "lookup"
    assert (1 - PROBE_SLACK) * probe.baseline < probe.rate < probe.baseline
    longer = policy.choose(32, lookup_len=10, lookup_ngram=2, probe=True, longer_than=probe.k)
    assert longer.k == 0 or longer.k > probe.k
    # Never the draft model, and nothing that loses more than the slack.
    assert policy.choose(32, probe=True).k == 0
    assert policy.choose(32, lookup_len=10, lookup_ngram=9, probe=True).rate >= (
        (1 - PROBE_SLACK) * probe.baseline)


def test_auto_corrects_a_pessimistic_calibration_by_probing():
    # Calibration said scoring n tokens costs n times one (a CPU under load at that moment);
    # in truth every call costs the same (say a GPU that was still warming up).
    true_cost = 0.010
    policy = Policy(CostCurve({1: true_cost, 4: 4 * true_cost, 16: 16 * true_cost}))
    auto = AutoDrafter(policy, LookupDrafter())
    context = list(range(40)) * 3  # lookup always offers a long match
    params, rng = SamplingParams(temperature=0.0), make_rng(0)
    drafted = []
    for _ in range(1000):
        draft = auto.propose(context, 16, params, rng)
        nxt = context[len(context) - 40]
        new = list(draft.tokens) + [context[len(context) - 40 + len(draft.tokens)]]
        assert new[0] == nxt  # the period-40 text: lookup is always right
        auto.observe(Outcome(draft, len(draft.tokens), len(draft.tokens), new, 0.0, true_cost))
        context += new
        drafted.append(len(draft.tokens))
    assert sum(drafted[:AutoDrafter.REPROBE_ROUNDS - 1]) == 0  # the curve forbade drafting
    # A probe walks one length further every REPROBE_ROUNDS rounds (t(5) was assumed 5x dearer
    # than it is): long drafts every round by the end.
    assert min(drafted[-50:]) >= 6
    assert policy.curve(4) == pytest.approx(true_cost, rel=0.01)


def test_a_fixed_width_curve_is_a_staircase_of_one_price():
    # Measured points of a W = 4 target: calls of 1 and 4 tokens cost one call, 8 tokens two.
    t = CostCurve({1: 0.0030, 4: 0.0028, 8: 0.0058}, width=4)
    assert t.points == {4: pytest.approx(0.0029)}  # the median price per call
    assert t(1) == t(4) == pytest.approx(0.0029)
    assert t(5) == t(8) == pytest.approx(2 * 0.0029) and t(9) == pytest.approx(3 * 0.0029)
    t.observe(8, 2 * 0.0039)  # a two-call round at 3.9 ms a call: blended as one price
    # three calibration points count as three observations: the fourth weighs 1/4
    assert t(1) == pytest.approx(0.0029 + 0.25 * 0.001)


def test_at_a_fixed_width_auto_drafts_to_fill_the_calls():
    # Every call up to W = 8 costs the same, so a near-sure lookup draft fills its calls
    # (k + 1 a multiple of 8) and never spills into a part-used call.
    policy = Policy(CostCurve({8: 0.0028}, width=8), CostEstimate(0.0005))
    for _ in range(30):
        policy.observe_lookup(4, 8, False)
    choice = policy.choose(32, lookup_len=32, lookup_ngram=4)
    assert choice.source == "lookup" and choice.k >= 7 and (choice.k + 1) % 8 == 0


class _Clocked(FakeLM):
    """A fake whose decode of n tokens records its n (to see the measuring order)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.widths: list[int] = []

    def decode(self, tokens, n_logits):
        self.widths.append(len(tokens)) if n_logits else None
        return super().decode(tokens, n_logits)


def test_calibration_repeats_interleave_the_points_and_stop_at_the_budget():
    lm = _Clocked(Table(50, seed=1), n_ctx=64)
    curve = measure_target_curve(lm, (1, 4, 2), repeats=3, budget_s=10.0)
    assert set(curve) == {1, 4, 2}
    assert lm.widths == [1] + [1, 4, 2] * 3  # a warm-up, then three passes in the given order
    lm = _Clocked(Table(50, seed=1), n_ctx=64)
    measure_target_curve(lm, (1, 4, 2), repeats=3, budget_s=0.0)
    assert lm.widths == [1, 1]  # the budget spent: the first point only, measured once


def test_the_draft_cost_is_a_median_of_the_runs_that_fit_the_budget():
    from edgespec.core.costs import measure_draft_cost

    lm = _Clocked(Table(50, seed=1), n_ctx=64)
    assert measure_draft_cost(lm, n=3, repeats=4, budget_s=10.0) > 0
    assert lm.widths == [1] * (1 + 4 * 3)  # a warm-up, then four runs of three tokens
    lm = _Clocked(Table(50, seed=1), n_ctx=64)
    measure_draft_cost(lm, n=3, repeats=4, budget_s=0.0)
    assert lm.widths == [1] * (1 + 3)  # no room for a second run


def _penalties(widths, last_shape, last_run):
    """Penalties a sequence of calls pays, simulated call by call: a call is free only as the
    third or later of its width in a row (a replayed CUDA graph)."""
    paid = 0
    for w in widths:
        paid += not (w == last_shape and last_run >= 2)
        last_shape, last_run = w, (last_run + 1 if w == last_shape else 1)
    return paid


def _choose_by_loop(policy, k_max, lookup_len=0, lookup_ngram=0, *, probe=False, longer_than=0,
                    last_shape=None, last_run=2, continue_rate=0.0):
    """The choice rule written as the plain loop over k that Policy.choose vectorises."""
    from edgespec.core.policy import MARGIN

    t = policy.curve
    baseline = 1.0 / t(1)
    best = ("none", 0, baseline)
    if k_max <= 0:
        return best
    floor = baseline * (1.0 - PROBE_SLACK if probe else 1.0 + MARGIN)

    def penalties(k):  # (its own call's, all it adds to plain decoding's) for k drafts
        plain = [1] * 4
        own = _penalties([k + 1], last_shape, last_run)
        return own, (_penalties([k + 1, *plain], last_shape, last_run)
                     - _penalties(plain, last_shape, last_run))

    def cost(k, model):  # a round of k drafts: t(k + 1) and the penalties charged to it
        if not t.switch_penalty or t.width:
            return t(k + 1)
        own, added = penalties(k)
        if model:  # the draft model can always go on: its own call only
            return t(k + 1) + t.switch_penalty * own
        once = 1.0 - continue_rate  # paid once a stretch: over its expected length
        entering = last_shape in (None, 1)
        if entering or k + 1 == last_shape:  # entering, or the capture
            return t(k + 1) + t.switch_penalty * added * once
        return t(k + 1) + t.switch_penalty * (own + (added - own) * once)  # a new width

    def chain(k):  # draft i is reached with the match i tokens longer (up to max_ngram)
        drafts, reached = 0.0, 1.0
        for i in range(k):
            size = min(lookup_ngram + i, max(policy.max_ngram, lookup_ngram))
            reached *= policy.lookup_estimate(size).alpha
            drafts += reached
        # (1 + the sum, in the order numpy's cumsum takes: flat stretches of a fixed width's
        # staircase tie to the last bit, and the shorter draft must win both ways)
        return 1.0 + drafts

    if lookup_len > 0:
        c = policy.lookup_cost.seconds
        for k in range(1, min(k_max, lookup_len) + 1):
            rate = chain(k) / (cost(k, False) + c)
            if k > longer_than and rate > max(best[2] if best[1] else 0.0, floor):
                best = ("lookup", k, rate)
    if policy.draft_cost is not None and not probe:
        a, c = policy.model.alpha, policy.draft_cost.seconds
        for k in range(1, k_max + 1):
            rate = expected_tokens(a, k) / (cost(k, True) + k * c)
            if rate > max(best[2] if best[1] else 0.0, floor):
                best = ("model", k, rate)
    return best


def test_the_vectorised_choice_is_the_loop_over_k():
    """Policy.choose rates every k at once; on 3,000 random cost curves (CPU-like to flat,
    fixed widths too, with and without a switch penalty), acceptance rates, draft costs, match
    lengths, previous call shapes and probes it picks what the loop over k picks, at the same
    rate (to float rounding)."""
    import numpy as np

    rng = np.random.default_rng(11)
    for case in range(3000):
        n_points = int(rng.integers(1, 5))
        ns = sorted(set(int(x) for x in rng.integers(1, 40, n_points)))
        t1 = float(rng.uniform(0.001, 0.05))
        points = {n: t1 * (1 + float(rng.uniform(0, 1.2)) * (n - 1)) for n in ns}
        width = int(rng.choice([0, 0, 0, 4, 8, 16]))
        penalty = float(rng.choice([0.0, rng.uniform(0, 1.5) * t1]))
        curve = CostCurve(points, width=width, switch_penalty=penalty)
        policy = Policy(curve, CostEstimate(float(rng.uniform(0.0, 0.02)))
                        if rng.random() < 0.8 else None)
        policy.model = AcceptanceEstimate(float(rng.uniform(0, 1)))
        ngram = int(rng.integers(1, 10))  # (past max_ngram too: the chain starts at its cap)
        for size in range(ngram, max(policy.max_ngram, ngram) + 1):
            if rng.random() < 0.7:  # else the prior for that size
                policy.lookup[size] = AcceptanceEstimate(
                    float(rng.choice([rng.uniform(0, 1), 1.0])))
        k_max, lookup_len = int(rng.integers(0, 40)), int(rng.integers(0, 40))
        probe = bool(rng.random() < 0.2)
        longer = int(rng.integers(0, 6)) if probe else 0
        last = rng.choice([None, 1, width or int(rng.integers(1, 12))])
        run = 0 if last is None else int(rng.integers(1, 4))
        goes_on = float(rng.choice([0.0, rng.uniform(0, 1)]))
        got = policy.choose(k_max, lookup_len, ngram, probe=probe, longer_than=longer,
                            last_shape=last, last_run=run, continue_rate=goes_on)
        want = _choose_by_loop(policy, k_max, lookup_len, ngram, probe=probe, longer_than=longer,
                               last_shape=last, last_run=run, continue_rate=goes_on)
        assert (got.source, got.k) == want[:2], case
        assert got.rate == pytest.approx(want[2], rel=1e-12), case
        table = curve.table(45)
        # (seconds: an extrapolation near zero differs by float cancellation, ~1e-15 s)
        assert np.allclose(table[1:], [curve(n) for n in range(1, 46)], rtol=1e-12, atol=1e-12), case


def test_a_curves_lower_bound_is_the_least_t_over_its_range():
    """CostCurve.lower_bound(lo, hi), which lets a choice skip rating lookup's every k, is no
    larger than any t(n) for n in [lo, hi] as the table gives them, and (piecewise-linear
    curves) equal to the least of them: on 2,000 random curves and ranges."""
    import numpy as np

    rng = np.random.default_rng(5)
    for case in range(2000):
        ns = sorted(set(int(x) for x in rng.integers(1, 40, int(rng.integers(1, 6)))))
        points = {n: float(rng.uniform(0.001, 0.02)) for n in ns}  # rising or not
        width = int(rng.choice([0, 0, 0, 4, 8]))
        curve = CostCurve(points, width=width)
        lo = int(rng.integers(1, 50))
        hi = lo + int(rng.integers(0, 20))
        table = curve.table(hi)[lo:hi + 1]
        assert curve.lower_bound(lo, hi) <= table.min() * (1 + 1e-12), case
        assert curve.lower_bound(lo, hi) == pytest.approx(table.min(), rel=1e-9, abs=1e-12), case


class _CountingPolicy(Policy):
    calls = 0

    def choose(self, *args, **kw):
        self.calls += 1
        return super().choose(*args, **kw)


class _RecordingModel:
    """A stand-in for the draft model drafter: records when auto asks it for a draft; always
    in step with the text (nothing to read first), its calls at the price it is rated at."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def propose(self, context, k, params, rng):
        from edgespec.runtime.drafters import Draft

        self.asked.append(len(context))
        return Draft([1] * k, [1] * k, "model")

    def behind(self, context) -> int:
        return 1

    def wide(self, behind: int) -> bool:
        return False

    def step_cost(self) -> None:
        return None

    def catch_up_excess(self, per_token: float) -> tuple[int, bool, float]:
        return 1, False, 0.0


def _retrial_rounds(rounds: int) -> list[int]:
    """The rounds (from 0) in which auto re-tries a draft model that keeps losing: after
    RETRY_MIN rounds without it, then each wait twice the last, up to REPROBE_ROUNDS (the
    round of a re-trial itself is one with the model)."""
    schedule, wait = [], AutoDrafter.RETRY_MIN
    at = wait
    while at < rounds:
        schedule.append(at)
        wait = min(2 * wait, AutoDrafter.REPROBE_ROUNDS)
        at += wait + 1
    return schedule


@pytest.mark.parametrize("prior_pays", [False, True])
def test_the_draft_model_is_reconsidered_with_a_growing_wait(prior_pays):
    """After the draft model lost its place, auto reconsiders it (forgetting its acceptance)
    after RETRY_MIN rounds, then after twice as many each time, up to REPROBE_ROUNDS: taken or
    not, once per wait, so a declined re-trial does not make every later round choose twice
    (on a GPU that was ~5% of a token). When the model wins at its prior, the re-trial drafts
    with it; one rejection at the prior's 1-token draft then costs it the next wait only."""
    # GPU-like costs: a draft token at 0.3 of a target call pays at the prior 0.6 (k = 1 rate
    # 1.6 / 1.3 against 1 / 1.0); at 0.6 of a call it does not (1.6 / 1.6), though a sure
    # draft still could (model_can_pay: 9 tokens for 1.1 + 8 x 0.6 calls at k = 8).
    cost = 0.3e-3 if prior_pays else 0.6e-3
    policy = _CountingPolicy(CostCurve({1: 1.0e-3, 2: 1.0e-3, 32: 1.4e-3}), CostEstimate(cost))
    policy.model = AcceptanceEstimate(0.6, successes=0.0, failures=50.0)  # it lost its place
    model = _RecordingModel()
    auto = AutoDrafter(policy, LookupDrafter(), model)
    params, rng = SamplingParams(temperature=0), make_rng(0)
    context = list(range(1000, 1100))  # no n-gram recurs: lookup never offers a draft
    rounds = 5 * AutoDrafter.REPROBE_ROUNDS
    for i in range(rounds):
        draft = auto.propose(context, 8, params, rng)
        if draft.source == "model":
            # rejected at once: the model loses its place again
            auto.observe(Outcome(draft, len(draft.tokens), 0, [2000 + i], 1e-4, 1e-3))
            policy.model = AcceptanceEstimate(0.6, successes=0.0, failures=50.0)
        else:
            auto.observe(Outcome(draft, 0, 0, [2000 + i], 1e-5, 1e-3))
        context.append(2000 + i)
    assert policy.model_can_pay(8)
    schedule = _retrial_rounds(rounds)
    assert schedule[:4] == [8, 25, 58, 123]  # (waits of 8, 16, 32, 64 rounds)
    # a re-trial's consideration chooses twice (declined, then at the prior)
    assert policy.calls <= rounds + len(schedule)
    if prior_pays:
        assert model.asked == [100 + at for at in schedule]
    else:
        assert model.asked == []


def test_a_model_round_that_keeps_every_draft_shortens_the_wait_again():
    """The wait before a re-trial grows while re-trials fail, and is back at RETRY_MIN once a
    model round has had all its drafts accepted (the text suits the model again)."""
    policy = Policy(CostCurve({1: 1.0e-3, 2: 1.0e-3, 32: 1.4e-3}), CostEstimate(0.3e-3))
    auto = AutoDrafter(policy, LookupDrafter(), _RecordingModel())
    auto._retry_after = AutoDrafter.REPROBE_ROUNDS
    draft = Draft([1, 2, 3], [None] * 3, "model")
    auto.observe(Outcome(draft, 3, 2, [1, 2, 9], 1e-4, 1e-3))  # one refused: no change
    assert auto._retry_after == AutoDrafter.REPROBE_ROUNDS
    auto.observe(Outcome(draft, 3, 3, [1, 2, 3, 4], 1e-4, 1e-3))
    assert auto._retry_after == AutoDrafter.RETRY_MIN


class _ShapeClock:
    """A target whose calls cost more when the call before had another width, as a CUDA
    backend that replays a captured graph only for a repeated shape (sleeps, in seconds)."""

    def __init__(self, steady: float, penalty: float, per_token: float = 0.0,
                 capture: float | None = None) -> None:
        self.n_ctx, self.n_vocab, self.tokens = 512, 1000, []
        self.steady, self.penalty, self.per_token = steady, penalty, per_token
        #: None: only a call after another width pays; else the CUDA graph rule (the second
        #: of a width in a row captures, paying the penalty and this more; the third replays)
        self.capture = capture
        self._last, self._run = None, 0

    def sync(self, prefix):
        n = 0
        while n < min(len(prefix), len(self.tokens)) and prefix[n] == self.tokens[n]:
            n += 1
        del self.tokens[n:]
        return n

    def decode(self, tokens, n_logits):
        import time

        shape = len(tokens)
        run = self._run if shape == self._last else 0  # (calls of this width just before)
        if self.capture is None:
            extra = self.penalty if not run else 0.0
        else:
            extra = 0.0 if run >= 2 else self.penalty + (self.capture if run == 1 else 0.0)
        time.sleep(self.steady + self.per_token * shape + extra)
        self._last, self._run = shape, run + 1
        self.tokens.extend(tokens)
        return None


def test_the_switch_penalty_is_measured_and_taken_off_the_interleaved_points():
    from edgespec.core.costs import measure_steady, split_switch_penalty

    # 10 ms a call, 10 ms more after another width, 1 ms per token (sleeps overshoot a little:
    # the bounds leave 3 ms for that)
    clock = _ShapeClock(0.010, 0.010, 0.001)
    # (the first t(1) follows the warm-up's single token: the median of 3 is an interleaved one)
    interleaved = measure_target_curve(clock, (1, 4, 8), repeats=3)
    assert 0.020 <= interleaved[1] < 0.024
    steady = measure_steady(clock, 1)
    assert 0.011 <= steady < 0.014
    curve, penalty = split_switch_penalty(interleaved, steady)
    assert 0.008 < penalty < 0.013
    assert 0.012 <= curve[4] < 0.018 and 0.016 <= curve[8] < 0.022  # 10 ms + 1 ms a token
    # A CPU: no penalty beyond noise (under a tenth of t(1)) leaves the points as measured.
    assert split_switch_penalty({1: 0.0105, 4: 0.030}, 0.010) == ({1: 0.0105, 4: 0.030}, 0.0)


def test_the_return_penalty_is_what_a_lone_call_costs_beyond_three_switch_penalties():
    """measure_return_penalty: three plain calls, a call of another width, two plain calls;
    what they cost beyond the curve's t and three penalties. Under the CUDA graph rule that
    is the capture of the plain step's graph (10 ms more here); without one, nothing."""
    from edgespec.core.costs import measure_return_penalty, measure_steady, split_switch_penalty

    for capture, lo, hi in ((0.010, 0.007, 0.016), (0.0, 0.0, 0.004)):
        # 10 ms a call, 10 ms more unless replayed, 1 ms a token (sleeps overshoot a little)
        clock = _ShapeClock(0.010, 0.010, 0.001, capture=capture)
        interleaved = measure_target_curve(clock, (1, 4, 8), repeats=3)
        points, penalty = split_switch_penalty(interleaved, measure_steady(clock, 1))
        curve = CostCurve(points, switch_penalty=penalty)
        assert lo <= measure_return_penalty(clock, curve, (4,), runs=1) < hi
    # within a budget: one lone round (six calls) where calls are slow, however many were asked
    calls, decode = [], clock.decode
    clock.decode = lambda tokens, n: calls.append(len(tokens)) or decode(tokens, n)
    measure_return_penalty(clock, curve, (4, 6), runs=3, budget_s=0.0)
    assert calls == [1, 1, 1, 4, 1, 1]


def test_with_a_switch_penalty_drafting_keeps_its_width_and_lone_drafts_must_win_more():
    # GPU-like: a call of up to 9 tokens costs about the same; changing width costs 70% more.
    curve = CostCurve({1: 2.0e-3, 4: 2.7e-3, 8: 3.5e-3, 16: 4.3e-3}, switch_penalty=1.4e-3)
    policy = Policy(curve)
    _lookup_everywhere(policy, 0.5)  # a lookup right half the time
    plain_before = policy.choose(16, lookup_len=8, lookup_ngram=3, last_shape=1)
    assert plain_before.source == "none"  # one draft round would pay the width change twice
    without = Policy(CostCurve(dict(curve.points)))
    without.lookup = policy.lookup
    assert without.choose(16, lookup_len=8, lookup_ngram=3, last_shape=1).source == "lookup"
    # Already drafting 3 tokens (calls 4 wide) at an acceptance near 2/3: without the penalty
    # k = 4 rates a little higher (2.61 tokens in 2.9 ms against 2.41 in 2.7); with it, k = 3
    # keeps the width and skips the penalty.
    _lookup_everywhere(policy, 2 / 3)
    assert without.choose(16, lookup_len=8, lookup_ngram=3, last_shape=4).k != 3
    assert policy.choose(16, lookup_len=8, lookup_ngram=3, last_shape=4).k == 3


def test_auto_tells_the_curve_which_calls_paid_the_switch_penalty():
    """AutoDrafter passes the last call's width and run to each choice, and observes a call
    that paid the penalty (the first of a width, and the second, which captures the graph)
    without it, so t(n) stays the steady cost; a plain call that paid it is left out of t(1)
    (replayed plain steps measure it; the penalised ones are the return penalty's)."""
    curve = CostCurve({1: 2.0e-3, 8: 3.5e-3}, switch_penalty=1.0e-3)
    auto = AutoDrafter(Policy(curve), LookupDrafter())
    params, rng = SamplingParams(temperature=0), make_rng(0)
    context = list(range(50))
    draft = auto.propose(context, 4, params, rng)
    auto.observe(Outcome(draft, 0, 0, [99], 1e-5, 3.0e-3))  # after the prefill: a new width
    auto.observe(Outcome(draft, 0, 0, [98], 1e-5, 8.0e-3))  # the second in a row: a capture
    assert curve(1) == 2.0e-3
    auto.observe(Outcome(draft, 0, 0, [97], 1e-5, 2.2e-3))  # the third: replayed, as measured
    assert curve(1) == pytest.approx(2.0e-3 + (2.2e-3 - 2.0e-3) / 2)
    assert (auto._last_shape, auto._run) == (1, 3)
    auto.observe(Outcome(draft, 3, 0, [96], 1e-5, 4.5e-3))  # a round of 3 drafts: width 4
    assert (auto._last_shape, auto._run) == (4, 1)
    assert curve(4) == pytest.approx(3.5e-3)  # 4.5 ms less the penalty


def test_auto_learns_the_return_penalty_from_lone_rounds_only():
    """A lone round from steady plain decoding and the two plain steps after it: what they
    cost beyond the curve and three penalties is a sample of the return penalty (here 1 ms
    over its own call and 2 ms at the capture), blended in at the curve's rate; a round that
    a stretch follows is no sample. Nothing of it reaches t(1)."""
    curve = CostCurve({1: 2.0e-3, 4: 3.0e-3}, switch_penalty=1.0e-3)
    auto = AutoDrafter(Policy(curve), LookupDrafter())
    none = Draft(source="none")

    def step(drafted, seconds):
        auto.observe(Outcome(none, drafted, 0, [7], 1e-5, seconds))

    for _ in range(3):
        step(0, 2.0e-3)
    step(3, 3.0e-3 + 1.0e-3 + 1.0e-3)  # width 4: t(4) + P + 1 ms
    step(0, 2.0e-3 + 1.0e-3)  # without a graph: t(1) + P
    assert curve.return_penalty == 0.0  # (not yet: the capture is to come)
    step(0, 2.0e-3 + 1.0e-3 + 2.0e-3)  # the capture: t(1) + P + 2 ms
    assert curve.return_penalty == pytest.approx(0.2 * 3.0e-3)
    assert curve(1) == 2.0e-3
    learned = curve.return_penalty
    for _ in range(3):
        step(0, 2.0e-3)
    step(3, 9.0e-3)
    step(3, 9.0e-3)  # a stretch: the first round was not a lone one
    step(0, 5.0e-3)
    step(0, 9.0e-3)
    step(0, 2.0e-3)
    assert curve.return_penalty == learned
    # a stalled call is no penalty: a sample counts at most twice the estimate or t(1)
    step(3, 3.0e-3 + 1.0e-3)
    step(0, 3.0e-3)
    step(0, 3.0e-3 + 0.5)
    assert curve.return_penalty == pytest.approx(learned + 0.2 * (2 * 2.0e-3 - learned))


def test_a_lone_draft_round_is_charged_three_penalties_and_a_settled_stretch_none():
    from edgespec.core.policy import entry_charge, switch_charges

    p, r = 1.0e-3, 4.0e-3

    def charged(*state):
        own, back = switch_charges(p, 4, *state, back=r)
        return own + back

    # with a return penalty R: a lone round pays it on the way back, a stretch's second
    # round of one width pays it at its capture, a settled stretch never
    assert charged(1, 2) == pytest.approx([3 * p + r] * 4)
    assert charged(1, 1) == pytest.approx([2 * p] * 4)  # plain's own capture was to come
    assert charged(None, 0) == pytest.approx([p] * 4)
    assert charged(4, 1) == pytest.approx([p, p, p + r, p])
    assert charged(4, 2) == pytest.approx([p, p, 0.0, p])
    for state in ((1, 2), (1, 1), (1, 0), (None, 0), (None, 3)):
        assert charged(*state) == pytest.approx([entry_charge(p, *state, back=r)] * 4)

    def total(*state):
        own, back = switch_charges(p, 4, *state)
        return own + back

    # from steady plain decoding: the round itself, then the return (a new width, a capture)
    assert total(1, 2) == pytest.approx([3 * p] * 4)
    assert total(1, 1) == pytest.approx([2 * p] * 4)  # plain not yet settled
    assert total(None, 0) == pytest.approx([p] * 4)  # after the prefill
    # drafting 3 tokens a round (width 4), settled: the same width is free, another pays once
    assert total(4, 2) == pytest.approx([p, p, 0.0, p])
    assert total(4, 1) == pytest.approx([p] * 4)  # the capture is still to pay
    assert switch_charges(p, 4, 1, 2)[1] == pytest.approx(2 * p)  # the way back
    for state in ((1, 2), (1, 1), (1, 0), (None, 0), (None, 3)):  # the scalar the bound uses
        assert total(*state) == pytest.approx([entry_charge(p, *state)] * 4)


def test_a_round_from_plain_decoding_counts_on_a_stretch_as_often_as_one_went_on():
    """With a switch penalty, a lookup round from steady plain decoding shares its way in and
    back with the rounds expected to follow it, by ``continue_rate`` (how often a lookup
    round had a draft to go on with after it): at 0 it is charged the whole 3P and loses;
    where stretches go on it pays. Within a stretch the same width costs nothing more."""
    curve = CostCurve({1: 2.0e-3, 8: 2.7e-3, 16: 3.5e-3}, switch_penalty=2.4e-3)
    policy = Policy(curve)
    _lookup_everywhere(policy, 0.7)  # 12 drafts: 3.3 tokens for 3.2 ms (+ 7.2 ms of 3P)
    plain = dict(last_shape=1, last_run=40)
    assert policy.choose(16, 12, 6, continue_rate=0.0, **plain).source == "none"
    assert policy.choose(16, 12, 6, continue_rate=0.8, **plain).source == "lookup"
    within = dict(last_shape=13, last_run=2)
    assert policy.choose(16, 12, 6, continue_rate=0.0, **within).k == 12


class _AlternatingLookup:
    """A stand-in lookup that offers a sure 16-token draft in every round, except (with
    ``breaks``) the round right after one that drafted with it: generated code whose
    recurring lines give lookup a match in most plain steps, but whose drafts break off."""

    max_ngram = 8

    def __init__(self, breaks: bool) -> None:
        self.breaks, self.drafted = breaks, False

    def propose(self, context, k, params, rng):
        from edgespec.runtime.drafters import Draft

        if self.breaks and self.drafted:
            return Draft(source="lookup")
        return Draft([7] * 16, [None] * 16, "lookup", 8)


@pytest.mark.parametrize("breaks", [True, False])
def test_auto_learns_how_often_a_lookup_round_goes_on_not_how_often_lookup_offers(breaks):
    """The stretch's expected length comes from the rounds after lookup rounds only. Where
    lookup offers in every round but the one right after a lookup round (half of them, as
    auto takes each sure draft), the rate stays near 0 (an offer rate had charged such lone
    rounds a part of their 3P); where drafts go on, it rises towards 1."""
    curve = CostCurve({1: 2.0e-3, 16: 3.5e-3, 32: 4.5e-3}, switch_penalty=2.4e-3)
    policy = Policy(curve)
    _lookup_everywhere(policy, 0.99)  # sure drafts: worth their whole 3P
    lookup = _AlternatingLookup(breaks)
    auto = AutoDrafter(policy, lookup)
    params = SamplingParams(temperature=0.0)
    offered = rounds = 0
    for _ in range(60):
        draft = auto.propose([], 32, params, None)
        offered += bool(auto._shadow.tokens)
        rounds += 1
        n = len(draft.tokens)
        auto.observe(Outcome(draft, n, n, [7] * (n + 1), 0.0, curve(n + 1)))
        lookup.drafted = draft.source == "lookup"
    assert offered / rounds >= (0.5 if breaks else 0.99)
    if breaks:
        assert auto._goes_on.alpha < 0.1
    else:
        assert auto._goes_on.alpha > 0.9


def test_a_lookup_draft_is_rated_as_a_chain_of_longer_and_longer_matches():
    """Draft i of a match of n tokens is reached only if the drafts before it were right, and
    then the match is n + i tokens long: E(k) = 1 + sum of the products of the estimates for
    sizes n, n + 1, ... (the cap, max_ngram, repeating)."""
    import numpy as np

    from edgespec.core.costs import expected_tokens_upto

    policy = Policy(CostCurve(dict(GPU)), max_ngram=4)
    _lookup_everywhere(policy, 0.8)  # one alpha everywhere: the geometric series
    assert np.allclose(policy.lookup_expected(2, 10), expected_tokens_upto(0.8, 10))
    policy.lookup[3], policy.lookup[4] = AcceptanceEstimate(0.5), AcceptanceEstimate(0.9)
    assert np.allclose(policy.lookup_expected(3, 4),
                       [1.5, 1.5 + 0.45, 1.95 + 0.405, 2.355 + 0.3645])
    # a match longer than the cap is its own cap: its estimate all the way
    assert np.allclose(policy.lookup_expected(6, 3), expected_tokens_upto(0.7, 3))


def test_lookup_evidence_goes_to_the_match_size_each_token_was_drafted_at():
    """observe_lookup: a proposal from a 3-token match right for 7 tokens, then wrong: sizes
    3 .. 7 saw one success each, the cap (8) two and the refutation; right for 2 only: sizes
    3 and 4 one success, size 5 the failure. One update per size and round."""
    policy = Policy(CostCurve(dict(GPU)))
    policy.observe_lookup(3, 7, True)
    seen = {n: (e.successes, e.failures) for n, e in policy.lookup.items()}
    assert seen == {3: (1, 0), 4: (1, 0), 5: (1, 0), 6: (1, 0), 7: (1, 0), 8: (2, 1)}
    policy = Policy(CostCurve(dict(GPU)))
    policy.observe_lookup(3, 2, True)
    seen = {n: (e.successes, e.failures) for n, e in policy.lookup.items()}
    assert seen == {3: (1, 0), 4: (1, 0), 5: (0, 1)}
    policy.observe_lookup(8, 20, False)  # a sure copy at the cap: one update of 20
    assert (policy.lookup[8].successes, policy.lookup[8].failures) == (20, 0)


def test_the_chain_recovers_a_copy_that_firms_up_as_it_goes():
    """Shadow comparisons (one token a plain step) from a process where a young match (under
    5 tokens) is right 60% of the time and a grown one 99%: the chain's expected tokens for a
    16-token draft from a 2-token match land near the truth (4.8); one estimate for the whole
    draft (the size it starts from, as before) says about half of it.

    Thresholds, over 20 fixed seeds of 600 rounds: with forgetting at 0.95 each young size
    has ~20 effective observations, so each young estimate carries ~0.11 of noise
    (sqrt(0.24 / 20)), and the product of three of them ~20% of the truth: the chain's median
    error must stay under 25%. The single estimate's error is a bias (~48%, 2.5 against
    4.8), not noise: it must be at least twice the chain's."""
    import numpy as np

    from edgespec.core.costs import expected_tokens

    def right(size):
        return 0.6 if size < 5 else 0.99

    chain_err, single_err = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        policy = Policy(CostCurve(dict(GPU)))
        size = 2
        for _ in range(600):
            if rng.random() < right(size):
                policy.observe_lookup(size, 1, False)
                size = min(size + 1, policy.max_ngram)
            else:
                policy.observe_lookup(size, 0, True)
                size = 2  # a miss: the next match starts young
        truth, reached = 1.0, 1.0
        for i in range(16):
            reached *= right(min(2 + i, policy.max_ngram))
            truth += reached
        chain = float(policy.lookup_expected(2, 16)[-1])
        single = expected_tokens(policy.lookup_estimate(2).alpha, 16)
        chain_err.append(abs(chain - truth) / truth)
        single_err.append(abs(single - truth) / truth)
    assert np.median(chain_err) < 0.25
    assert np.median(single_err) > 2 * np.median(chain_err)


class _ProbeCountingPolicy(Policy):
    probes = 0

    def choose(self, *args, **kw):
        self.probes += bool(kw.get("probe"))
        return super().choose(*args, **kw)


@pytest.mark.parametrize("penalty", [0.0, 2.4e-3])
def test_on_a_gpu_a_cost_probe_waits_for_a_stretch(penalty):
    """A cost probe (a lookup draft predicted to lose a little, to measure t(k + 1)) is
    considered every REPROBE_ROUNDS rounds. On a CPU (no switch penalty) it may come from plain
    decoding; with a switch penalty a probe from plain decoding would be a lone round, 3P
    dearer than its rate says once the estimate proves wrong, so it waits for a stretch."""
    import numpy as np

    policy = _ProbeCountingPolicy(CostCurve({1: 2.0e-3, 16: 6.0e-3}, switch_penalty=penalty))
    auto = AutoDrafter(policy, _OfferingLookup(np.random.default_rng(0), 1.0, 6))
    params = SamplingParams(temperature=0.0)
    for _ in range(2 * AutoDrafter.REPROBE_ROUNDS):  # plain steps: every offer is wrong
        draft = auto.propose([], 16, params, None)
        assert not draft.tokens or not penalty
        n = len(draft.tokens)
        auto.observe(Outcome(draft, n, 0, [8], 0.0, policy.curve(n + 1)))
        auto._last_shape, auto._run = 1, 9  # (steady plain decoding, whatever was played)
    assert policy.probes == (0 if penalty else 2)
    auto._last_shape, auto._run = 9, 1  # the last call drafted 8 tokens: within a stretch
    auto.propose([], 16, params, None)
    assert policy.probes == (1 if penalty else 2)


def test_a_ban_is_cleared_only_on_a_settled_record():
    """A source judged paying goes back to the shortest ban, but only once its last round's
    dearer plain steps are charged: at the drafting round itself a record near break-even
    looks better than it is, and clearing there kept a losing source's bans at the shortest."""
    from edgespec.core.policy import GUARD_BAN, GUARD_EVIDENCE, Realized

    r = Realized(plain_prior=2.0e-3)
    for _ in range(10):
        r.record("none", 1, 2.0e-3)
    while r.allowed("lookup"):  # a first ban: 2 tokens in 3 ms, then 2.4 ms more to settle
        r.record("lookup", 2, 3.0e-3)
        r.record("none", 1, 4.4e-3)
        r.record("none", 1, 4.4e-3)
    assert r.ban["lookup"] == GUARD_BAN
    while not r.allowed("lookup"):
        r.record("none", 1, 2.0e-3)
    # a stretch of 8 rounds of 4 tokens in 6.8 ms (588/s, above plain's 500/s) crosses
    # GUARD_EVIDENCE paying; the two plain steps after it cost 12 ms more (465/s, losing)
    for _ in range(8):
        r.record("lookup", 4, 6.8e-3)
        assert r.ban["lookup"] == GUARD_BAN  # not cleared before its debts are charged
    assert r.sources["lookup"].tokens >= GUARD_EVIDENCE
    r.record("none", 1, 8.0e-3)
    r.record("none", 1, 8.0e-3)
    assert not r.allowed("lookup")
    assert r.ban["lookup"] == 2 * GUARD_BAN  # losing again: doubled


class _GraphClock:
    """Virtual seconds of target calls on a GPU-like device: steady(n) when the call is the
    third or later of its width in a row (a replayed CUDA graph), ``penalty`` more otherwise."""

    def __init__(self, steady, penalty):
        self.steady, self.penalty = steady, penalty
        self.last, self.run = None, 0

    def call(self, n):
        paid = not (n == self.last and self.run >= 2)
        self.last, self.run = n, (self.run + 1 if n == self.last else 1)
        return self.steady(n) + self.penalty * paid


class _OfferingLookup:
    """A stand-in lookup offering a ``length``-token draft in a fraction ``p_offer`` of rounds,
    from a match at the longest n-gram size (so one estimate rates all of its tokens: its
    acceptance does not grow with the match)."""

    max_ngram = 8

    def __init__(self, rng, p_offer, length):
        self.rng, self.p_offer, self.length = rng, p_offer, length

    def propose(self, context, k, params, rng):
        from edgespec.runtime.drafters import Draft

        if self.rng.random() < self.p_offer:
            return Draft([7] * self.length, [None] * self.length, "lookup", self.max_ngram)
        return Draft(source="lookup")


def _virtual_rate(p_offer, alpha, rounds=3000, seed=0, hidden=0.0, length=6):
    """Tokens per virtual second of auto over a GPU-like clock (t(1) 2 ms, 0.1 ms a token more,
    a 2.4 ms penalty as measured on an H100), with lookup drafts of ``length`` tokens offered
    in a fraction of rounds and each drafted token right with probability ``alpha``;
    ``hidden``: seconds every drafting round costs beyond the clock, which no estimate is
    told of."""
    import numpy as np

    def steady(n):
        return 2.0e-3 + 0.1e-3 * (n - 1)

    curve = CostCurve({n: steady(n) for n in (1, 4, 8, 16, 32)}, switch_penalty=2.4e-3)
    rng = np.random.default_rng(seed)
    auto = AutoDrafter(Policy(curve), _OfferingLookup(rng, p_offer, length))
    clock, params = _GraphClock(steady, 2.4e-3), SamplingParams(temperature=0)
    elapsed = tokens = 0.0
    for _ in range(rounds):
        draft = auto.propose([], 32, params, None)
        shadow = auto._shadow.tokens
        right = 0  # how many of the offered tokens the target would have committed
        while right < len(shadow) and rng.random() < alpha:
            right += 1
        drafted = len(draft.tokens) if draft.source == "lookup" else 0
        accepted = min(right, drafted)
        new = [7] * accepted + [7 if right > accepted else 8]
        seconds = clock.call(drafted + 1)
        stall = hidden if drafted else 0.0
        auto.observe(Outcome(draft, drafted, accepted, new, stall, seconds))
        elapsed += seconds + stall
        tokens += len(new)
    return tokens / elapsed


def test_on_gpu_costs_auto_skips_lone_drafts_that_the_return_to_plain_decoding_would_eat():
    """Virtual GPU clock with CUDA-graph costs: lookup offers 6 tokens in 30% of rounds, each
    right with probability 0.7 (about 2.4 tokens a round gained if taken). A lone draft round
    from steady plain decoding costs the round plus three penalties (its call, then the first
    plain call and the capture): it loses, and auto must stay within 5% of plain decoding.
    Charging only the round's own change of width (the rule before) ran at 0.88x here, with
    the record of what drafting delivered (Realized) off: the choice alone must get this
    right. (With the record on, the rule before runs at 0.975x: the record sets lookup aside.)
    Where drafts are offered every round and nearly always right, auto drafts in stretches
    whose calls keep their width and replay graphs: at least 1.5x."""
    from edgespec.core import policy as policy_mod

    plain = 1.0 / 2.0e-3
    assert _virtual_rate(0.3, 0.7) >= 0.95 * plain
    assert _virtual_rate(1.0, 0.95) >= 1.5 * plain
    old = policy_mod.switch_charges, policy_mod.entry_charge, policy_mod.GUARD_FRACTION
    try:  # the rule before: one penalty where the width changes, nothing for the return
        policy_mod.switch_charges = lambda p, n, last, run, back=0.0: (
            p * (policy_mod.counts_upto(n + 1, start=2) != last), 0.0)
        policy_mod.entry_charge = lambda p, last, run, back=0.0: p
        policy_mod.GUARD_FRACTION = 0.0
        assert _virtual_rate(0.3, 0.7) < 0.95 * plain
    finally:
        policy_mod.switch_charges, policy_mod.entry_charge, policy_mod.GUARD_FRACTION = old


def test_realized_rates_set_a_losing_source_aside_and_charge_it_the_dearer_plain_steps():
    from edgespec.core.policy import GUARD_BAN, GUARD_EVIDENCE, Realized

    r = Realized(plain_prior=2.0e-3)
    for _ in range(10):
        r.record("none", 1, 2.0e-3)  # steady plain steps: 500 tokens/s
    assert r.steady_plain() == pytest.approx(2.0e-3)
    # lookup rounds of 2 tokens in 3 ms (667/s) look fine alone, but each makes the next two
    # plain steps 2.4 ms dearer: 2 tokens in 7.8 ms (256/s), judged once enough is seen
    rounds = 0
    while r.allowed("lookup"):
        r.record("lookup", 2, 3.0e-3)
        r.record("none", 1, 4.4e-3)
        r.record("none", 1, 4.4e-3)
        rounds += 1
        assert rounds < 50
    # judged on its time: 7.8 ms a round is 3.9 plain steps, so GUARD_EVIDENCE steps' worth
    # (decayed) takes 7 rounds or more; not sooner
    assert 7 <= rounds <= 10
    assert r.steady_plain() == pytest.approx(2.0e-3)  # the extra went to lookup, not plain
    assert r.ban["lookup"] == GUARD_BAN
    for _ in range(r.banned_until["lookup"] - r.round - 1):
        r.record("none", 1, 2.0e-3)
    assert not r.allowed("lookup")
    r.record("none", 1, 2.0e-3)
    assert r.allowed("lookup")
    # losing again: twice as long; a source that pays is never set aside
    while r.allowed("lookup"):
        r.record("lookup", 2, 3.0e-3)
        r.record("none", 1, 4.4e-3)
        r.record("none", 1, 4.4e-3)
    assert r.ban["lookup"] == 2 * GUARD_BAN
    assert 2 * GUARD_BAN - 3 <= r.banned_until["lookup"] - r.round <= 2 * GUARD_BAN
    for _ in range(200):
        r.record("model", 4, 4.0e-3)  # 1,000 tokens/s
    assert r.allowed("model")


def test_long_drafts_that_fail_are_set_aside_on_their_time_not_their_tokens():
    """A CPU bench once ran an answer at 0.68x of plain decoding: 32-token lookup drafts, each
    as dear as ~20 plain steps, were right for 1 token in 66, and each such round committed one
    token, so a record judged only after GUARD_EVIDENCE tokens would have let 24 of them run.
    Judged on time too, two such rounds are enough. A source that delivers what the time
    promises is not set aside however few tokens it commits."""
    from edgespec.core.policy import GUARD_BAN, Realized

    r = Realized(plain_prior=0.05)
    for _ in range(10):
        r.record("none", 1, 0.05)  # a CPU's plain step: 20 tokens/s
    r.record("lookup", 1, 1.1)  # 33 tokens scored, 1 committed: the time of 22 plain steps
    assert r.allowed("lookup")
    r.record("none", 1, 0.05)
    r.record("lookup", 1, 1.1)
    assert not r.allowed("lookup") and r.ban["lookup"] == GUARD_BAN
    for _ in range(5):  # a 32-token draft that was right all along: 33 tokens in 1.1 s
        r.record("model", 33, 1.1)
    assert r.allowed("model")


def test_the_realized_check_catches_a_cost_the_estimates_miss():
    """On the virtual GPU clock, lookup rounds cost 8 ms more than any estimate says (say a
    host stall each time): the choice keeps drafting (16-token drafts, right 85% a token,
    offered in 70% of rounds: 2.1x plain decoding without the stall), the record of what
    drafting delivered sets lookup aside, and auto stays within 5% of plain decoding
    (0.977x); without the check it lost about a tenth (0.904x)."""
    from edgespec.core import policy as policy_mod

    plain = 1.0 / 2.0e-3
    assert _virtual_rate(0.7, 0.85, hidden=8.0e-3, length=16) >= 0.95 * plain
    saved = policy_mod.GUARD_FRACTION
    try:
        policy_mod.GUARD_FRACTION = 0.0
        assert _virtual_rate(0.7, 0.85, hidden=8.0e-3, length=16) < 0.92 * plain
    finally:
        policy_mod.GUARD_FRACTION = saved


@pytest.fixture
def model_ratings(monkeypatch):
    """The acceptance of every rating of the draft model's k over arrays, as they happen: in
    Policy.choose only that rating calls expected_tokens_upto (lookup's is its chain)."""
    from edgespec.core import policy as policy_mod

    ratings: list[float] = []
    original = policy_mod.expected_tokens_upto

    def counting(alpha, k):
        ratings.append(alpha)
        return original(alpha, k)

    monkeypatch.setattr(policy_mod, "expected_tokens_upto", counting)
    return ratings


def test_a_draft_model_that_cannot_pay_is_not_rated(model_ratings):
    """On the H100's costs (t(1) 2.2 ms, a 2.4 ms switch penalty, 1.24 ms a drafted token) the
    model at its prior acceptance cannot beat plain decoding from plain decoding: a scalar
    bound says so and its k are not rated over arrays (20-50 µs in the loop). Where it can
    pay (a sure model, within a stretch of its width) it is rated and chosen as before."""
    curve = CostCurve({1: 2.21e-3, 4: 3.16e-3, 8: 3.39e-3, 16: 4.86e-3, 33: 6.19e-3},
                      switch_penalty=2.38e-3)
    policy = Policy(curve, CostEstimate(1.24e-3))
    for run in range(2, 40):
        assert policy.choose(32, last_shape=1, last_run=run).source == "none"
    assert model_ratings == []
    policy.model = AcceptanceEstimate(0.97)
    choice = policy.choose(32, last_shape=9, last_run=2)
    assert len(model_ratings) == 1 and choice.source == "model"


def test_the_draft_models_rating_serves_a_few_rounds_while_its_inputs_stay(model_ratings):
    """Rating every k of the draft model is most of a choice's work; its inputs move only when
    it drafts or the shapes change, so one rating serves MODEL_REUSE rounds, and any change of
    its acceptance, cost or the last call's shape rates it again."""
    from edgespec.core.policy import MODEL_REUSE

    curve = CostCurve({1: 2.0e-3, 4: 2.4e-3, 16: 3.0e-3})
    policy = Policy(curve, CostEstimate(0.4e-3))
    policy.model = AcceptanceEstimate(0.9)
    first = policy.choose(8, last_shape=1)
    assert first.source == "model" and len(model_ratings) == 1
    for _ in range(MODEL_REUSE - 1):
        assert policy.choose(8, last_shape=1) == first
    assert len(model_ratings) == 1
    policy.choose(8, last_shape=1)  # served its rounds: rated again
    assert len(model_ratings) == 2
    policy.model.update(0, True)  # its acceptance moved
    policy.choose(8, last_shape=1)
    policy.draft_cost.observe(1.0e-3)  # its cost moved
    policy.choose(8, last_shape=1)
    policy.choose(8, last_shape=9)  # another shape
    assert len(model_ratings) == 5


def test_a_round_that_nothing_may_draft_makes_no_choice():
    """Without an offer from lookup (or with lookup set aside) and without a draft model that
    may draft, the round is a plain step and auto asks the policy nothing: a choice costs
    ~40 µs in the cold caches after a decode, 2% of a GPU token, in most rounds of free text.
    With an offer it chooses, and the same plain steps are counted as played."""
    import numpy as np

    policy = _CountingPolicy(CostCurve({1: 2.0e-3, 16: 6.0e-3}))
    lookup = _OfferingLookup(np.random.default_rng(0), 0.0, 6)
    auto = AutoDrafter(policy, lookup)
    params = SamplingParams(temperature=0.0)
    for _ in range(10):
        draft = auto.propose([], 16, params, None)
        assert draft.source == "none" and not draft.tokens
        auto.observe(Outcome(draft, 0, 0, [8], 0.0, 2.0e-3))
    assert policy.calls == 0 and auto.choices == {0: 10}
    lookup.p_offer = 1.0
    auto.realized.banned_until["lookup"] = auto.realized.round + 5  # set aside for 5 rounds
    for _ in range(5):
        auto.observe(Outcome(auto.propose([], 16, params, None), 0, 0, [8], 0.0, 2.0e-3))
    assert policy.calls == 0 and auto.choices == {0: 15}
    auto.propose([], 16, params, None)  # an offer that may be played: a choice
    assert policy.calls == 1 and sum(auto.choices.values()) == 16
    # A draft model that may draft is rated, offer or not.
    auto = AutoDrafter(_CountingPolicy(CostCurve({1: 2.0e-3}), CostEstimate(1e-3)),
                       _OfferingLookup(np.random.default_rng(0), 0.0, 6), _RecordingModel())
    auto.propose([], 16, params, None)
    assert auto.policy.calls == 1


def test_model_declines_answers_from_the_last_rating_as_choose_would():
    policy = Policy(CostCurve({1: 2.0e-3, 16: 6.0e-3}), CostEstimate(2.0e-3))
    assert not policy.model_declines(8, 1, 2)  # no rating yet: choose must rate it
    assert policy.choose(8, last_shape=1, last_run=2).source == "none"  # rates and declines
    assert policy.model_declines(8, 1, 2) and policy.model_declines(8, 1, 5)  # (run 5 ~ 2)
    assert not policy.model_declines(8, 4, 2)  # other inputs: no rating serves them
    key = policy._model_key(8, 1, 2)
    policy._model_option = (key, 3, (4, 2.0 / policy.curve(1)))  # a rating that takes it
    assert not policy.model_declines(8, 1, 2)
    assert policy.choose(8, last_shape=1, last_run=2).source == "model"
    assert Policy(CostCurve({1: 2.0e-3})).model_declines(8)  # no draft model at all


def test_a_round_without_an_offer_asks_nothing_while_the_models_last_rating_declines_it():
    """A draft model that may draft but loses to plain decoding (on a GPU: every plain step)
    is not chosen again for every round: while its last rating serves (MODEL_REUSE rounds
    with the same inputs) and declines it, a round without a lookup offer is a plain step
    with no choice; then it is rated afresh. Where the rating would take the model, the
    round still chooses, and drafts with it."""
    import math

    import numpy as np

    from edgespec.core.policy import MODEL_REUSE

    params = SamplingParams(temperature=0.0)
    rounds = 40
    for cost, wins in ((2.0e-3, False), (0.3e-3, True)):
        policy = _CountingPolicy(CostCurve({1: 2.0e-3, 16: 6.0e-3}), CostEstimate(cost))
        model = _RecordingModel()
        auto = AutoDrafter(policy, _OfferingLookup(np.random.default_rng(0), 0.0, 6), model)
        for _ in range(rounds):
            draft = auto.propose(list(range(10)), 16, params, None)
            n = len(draft.tokens)  # (where it wins, its drafts are right: it keeps winning)
            auto.observe(Outcome(draft, n, n if wins else 0, [8], 0.0, 2.0e-3))
        if wins:
            assert policy.calls == rounds and len(model.asked) == rounds
        else:
            # the first rounds see new call shapes (prefill, then plain steps 1 and 2 in a
            # row); a re-trial's consideration chooses twice (declined, then at the prior)
            retrials = 2 * len(_retrial_rounds(rounds))
            assert (rounds // MODEL_REUSE <= policy.calls
                    <= 3 + math.ceil(rounds / MODEL_REUSE) + retrials)
            assert auto.choices == {0: rounds} and model.asked == []


@pytest.mark.parametrize("hold_k, penalty, exit_by", [
    (4, 2.4e-3, "both"), (4, 2.4e-3, "hits"), (4, 2.4e-3, "guard"), (0, 2.4e-3, "both"),
    (4, 0.0, "both")])
def test_holding_a_width_with_the_draft_model(hold_k, penalty, exit_by, monkeypatch):
    """The experiment behind ``auto-hold`` (AutoDrafter.HOLD_K; off by default): on a machine
    with a switch penalty, once lookup's first token has been right in most recent rounds,
    auto plays lookup drafts capped at HOLD_K where lookup offers and HOLD_K tokens of the
    draft model where it does not (every call HOLD_K + 1 wide), judged together as "hold";
    when lookup stops being right, or once the held rounds lose (the guard), it goes back to
    its own choices (here: plain steps, as the model, wrong every time, cannot pay alone).
    Off, or without a switch penalty (a CPU), it never holds."""
    import numpy as np

    from edgespec.core import policy as policy_module

    monkeypatch.setattr(AutoDrafter, "HOLD_K", hold_k)
    if exit_by == "hits":  # no guard: only lookup's falling hit rate ends the hold
        monkeypatch.setattr(policy_module, "GUARD_FRACTION", 0.0)
    elif exit_by == "guard":  # no exit by hit rate: only the guard, once held rounds lose
        monkeypatch.setattr(AutoDrafter, "HOLD_EXIT", 0.0)
    def steady(n):
        return 2.0e-3 + 0.1e-3 * (n - 1)

    policy = Policy(CostCurve({n: steady(n) for n in (1, 4, 8, 16, 32)}, switch_penalty=penalty),
                    CostEstimate(1.5e-3))
    lookup = _OfferingLookup(np.random.default_rng(0), 1.0, 6)
    model = _RecordingModel()
    auto = AutoDrafter(policy, lookup, model)
    params = SamplingParams(temperature=0.0)

    def play(n_rounds):
        kinds = []
        for _ in range(n_rounds):
            draft = auto.propose(list(range(10)), 16, params, None)
            k = len(draft.tokens)
            if draft.source == "lookup":  # lookup is right: all its drafts and a bonus 7
                new, accepted, t_draft = [7] * (k + 1), k, 0.0
            elif draft.source == "model":  # the model is wrong (so it cannot pay alone)
                new, accepted, t_draft = [8], 0, 1.5e-3 * k
            else:
                new, accepted, t_draft = [7 if lookup.p_offer else 8], 0, 0.0
            auto.observe(Outcome(draft, k, accepted, new, t_draft, steady(k + 1)))
            kinds.append((draft.source if k else "none", k))
        return kinds

    copying = play(40)
    if hold_k and penalty:
        assert ("lookup", hold_k) in copying[-10:] and all(k <= hold_k for _, k in copying[-10:])
        assert model.asked == [] and "hold" in auto.realized.sources
    lookup.p_offer = 0.0  # the copy ends: lookup offers nothing
    after = play(60)
    if hold_k and penalty:
        held = [k for source, k in after if source == "model"]
        assert held and all(k == hold_k for k in held)  # the model holds the width a while
        assert after[-20:] == [("none", 0)] * 20  # then auto's own choice: plain steps
    else:
        assert model.asked == [] and "hold" not in auto.realized.sources
        assert after[-20:] == [("none", 0)] * 20


@pytest.mark.parametrize("long", [False, True])
def test_holding_with_long_lookup_drafts_plays_them_as_auto_would(long, monkeypatch):
    """AutoDrafter.HOLD_LONG (the ``auto-holdlong`` experiment; off by default): while holding,
    a lookup offer longer than HOLD_K is played at the length auto's own choice gives it (here
    7 of the 12 offered tokens: lookup is right every time, and a width's change is charged
    the switch penalty), not cut to HOLD_K; without it, cut."""
    import numpy as np

    monkeypatch.setattr(AutoDrafter, "HOLD_K", 4)
    monkeypatch.setattr(AutoDrafter, "HOLD_LONG", long)
    policy = Policy(CostCurve({n: 2.0e-3 + 0.1e-3 * (n - 1) for n in (1, 4, 8, 16, 32)},
                              switch_penalty=2.4e-3), CostEstimate(1.5e-3))
    auto = AutoDrafter(policy, _OfferingLookup(np.random.default_rng(0), 1.0, 12),
                       _RecordingModel())
    lengths = []
    for _ in range(40):
        draft = auto.propose(list(range(10)), 16, SamplingParams(temperature=0.0), None)
        k = len(draft.tokens)
        new = [7] * (k + 1) if draft.source == "lookup" else [7]
        auto.observe(Outcome(draft, k, k if draft.source == "lookup" else 0, new, 0.0,
                             2.0e-3 + 0.1e-3 * k))
        lengths.append(k)
    assert auto._holding and "hold" in auto.realized.sources
    assert lengths[-10:] == [7 if long else 4] * 10


def _random_policy(rng) -> tuple[Policy, int, int, float]:
    """A policy with random estimates on a GPU-like curve (a switch penalty), and a round's
    k_max, plain run so far and continue rate."""
    t1 = rng.uniform(1.5e-3, 3e-3)
    curve = CostCurve({1: t1, 4: t1 * rng.uniform(1.1, 1.6), 16: t1 * rng.uniform(1.6, 2.6),
                       33: t1 * rng.uniform(2.2, 3.5)}, switch_penalty=rng.uniform(0, 3e-3))
    policy = Policy(curve, CostEstimate(rng.uniform(3e-4, 1.5e-3)),
                    lookup_cost=CostEstimate(rng.uniform(1e-5, 2e-4)),
                    model=AcceptanceEstimate(rng.uniform(0.2, 0.95)))
    for n in range(1, policy.max_ngram + 1):
        if rng.random() < 0.7:
            est = policy.lookup_estimate(n)
            most = rng.choice([3.0, 30.0])  # (little evidence: one round moves it more)
            est.successes, est.failures = rng.uniform(0, most), rng.uniform(0, most)
    return policy, int(rng.integers(1, 33)), int(rng.integers(1, 6)), rng.uniform(0, 0.9)


def _drafts_after(policy: Policy, moved: int, update: tuple[int, bool], k_max: int, run: int,
                  cont: float):
    """A choice other than plain decoding that some offer gets once the plain step's
    observation ``update`` moved n-gram size ``moved`` (lookup's cost sampled at zero)."""
    import copy

    after = copy.deepcopy(policy)
    if moved and update != (0, False):
        after.lookup_estimate(moved).update(*update)
    after.lookup_cost.observe(0.0)
    for ngram in range(1, after.max_ngram + 1):
        for length in range(0, k_max + 1):
            choice = copy.deepcopy(after).choose(k_max, length, ngram, last_shape=1,
                                                 last_run=run, continue_rate=cont)
            if choice.source != "none":
                return choice
    return None


def test_an_assured_plain_step_is_what_every_offer_gets_after_one_more_observation():
    # Policy.plain_assured says a round from plain decoding is a plain step whatever one more
    # plain step shows (its shadow's n-gram size won or lost, lookup's cost sampled at zero,
    # t(1) as it is). Checked against the choice itself, for every offer the round could get:
    # lookup matches of every size and length, and none (the draft model alone). 400 random
    # states of the estimates, fixed seed.
    rng = np.random.default_rng(11)
    said = {True: 0, False: 0}
    for _ in range(400):
        policy, k_max, run, cont = _random_policy(rng)
        moved = int(rng.integers(0, policy.max_ngram + 1))
        assured = policy.plain_assured(k_max, run=run, continue_rate=cont, lookup=True,
                                       model=True, moved=moved)
        said[assured] += 1
        if assured:
            for update in ((0, False), (1, False), (0, True)):
                assert _drafts_after(policy, moved, update, k_max, run, cont) is None
    assert said[True] >= 40 and said[False] >= 40  # (both answers are exercised)


def test_a_plain_step_one_lookup_success_from_a_draft_is_not_assured():
    # the n-gram size the step's shadow has may win: where that one success makes some offer
    # draft, plain_assured must say False, though with no estimate moved it says plain
    rng = np.random.default_rng(3)
    found = 0
    for _ in range(3000):
        policy, k_max, run, cont = _random_policy(rng)
        moved = int(rng.integers(1, policy.max_ngram + 1))
        kw = {"run": run, "continue_rate": cont, "lookup": True, "model": True}
        if (policy.plain_assured(k_max, moved=0, **kw)
                and _drafts_after(policy, moved, (1, False), k_max, run, cont) is not None):
            found += 1
            assert not policy.plain_assured(k_max, moved=moved, **kw)
            if found == 2:
                break
    assert found == 2  # (rare: two of the 3000 states of this seed)


def test_the_model_bound_holds_for_every_k_and_declines_the_prior_on_an_h100():
    """_most_model_rate is never below the best k's rate (2,000 random cases, alpha 1 among
    them), and it declines what the 2026-11-28 H100's calibration offered the draft model at
    its prior: t(2) 2.38 ms, P 1.40, 1.15 ms a drafted token, plain at 2.06 ms (with the 3%
    margin), where the longest draft's tokens over one drafted token's time did not."""
    from edgespec.core.costs import expected_tokens
    from edgespec.core.policy import MARGIN, _most_model_rate

    rng = np.random.default_rng(7)
    for i in range(2000):
        alpha = 1.0 if i % 10 == 0 else float(rng.uniform(0.0, 0.999))
        base, per_token = float(rng.uniform(0.2e-3, 10e-3)), float(rng.uniform(0.05e-3, 5e-3))
        k_max = int(rng.integers(1, 65))
        best = max(expected_tokens(alpha, k) / (base + k * per_token) for k in range(1, k_max + 1))
        assert _most_model_rate(alpha, base, per_token, k_max) >= best * (1 - 1e-12)
    floor = (1 + MARGIN) / 2.06e-3
    assert _most_model_rate(0.6, 2.38e-3 + 1.40e-3, 1.15e-3, 32) < floor
    assert expected_tokens(0.6, 32) / (2.38e-3 + 1.40e-3 + 1.15e-3) > floor  # (the old bound)
