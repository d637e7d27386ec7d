"""Property-based tests (hypothesis) of the math modules: sampler, exact rejection step, lookup.

The example-based tests in test_sampling / test_rejection / test_lookup pin hand-built cases and
the statistical tests check sampled frequencies; here hypothesis searches the edge cases: zeros,
ties, tiny and huge logits (1e-30 apart, +-1e30), -inf entries, NaN, one-hot and disjoint
distributions, and short token streams over small alphabets, where n-gram matches are common.
The rejection step's exactness is checked analytically: the marginal of the emitted token is
computed from the function's own acceptance threshold and residual, not by sampling.

Every test is derandomized (same examples on every run) and has no deadline, so CI is stable.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from edgespec.core.lookup import LookupMatch, common_prefix, find_continuation
from edgespec.core.rejection import Source, residual, verify
from edgespec.core.sampling import SamplingParams, make_rng, process, sample
from edgespec.errors import LogitsError
from edgespec.runtime.drafters import LookupDrafter, ModelDrafter

PROPS = settings(max_examples=100, deadline=None, derandomize=True)
FEW = settings(max_examples=40, deadline=None, derandomize=True)

INF = math.inf
#: Logit values hypothesis mixes in: zeros, ties, values 1e-30 apart, huge magnitudes (whose
#: differences overflow to -inf after the shift) and a distinct neighbour of 1e30.
SPECIAL = [0.0, 1.0, -1.0, 2.0, 1e-30, 2e-30, -1e-30, 1e30, -1e30, 1e30 * (1 + 2**-50),
           1e300, -1e300, 700.0, -745.0]


# ---------------------------------------------------------------------------------------------
# Strategies


@st.composite
def logit_rows(draw, *, min_size=1, max_size=12, minus_inf=True):
    """A row of logits with at least one finite entry (and, if allowed, some -inf)."""
    n = draw(st.integers(min_size, max_size))
    element = st.one_of(
        st.sampled_from(SPECIAL),
        st.floats(-100, 100, allow_nan=False, allow_infinity=False),
        st.integers(-2, 2).map(float),  # exact ties
        *([st.just(-INF)] if minus_inf else []),
    )
    row = np.array(draw(st.lists(element, min_size=n, max_size=n)), dtype=np.float64)
    if not np.isfinite(row).any():
        row[draw(st.integers(0, n - 1))] = draw(st.sampled_from(SPECIAL))
    return row


temperatures = st.one_of(
    st.floats(0.05, 5.0), st.sampled_from([1e-3, 0.5, 1.0, 1e3])
)


@st.composite
def sampling_params(draw, *, greedy=None):
    """Every mode: greedy or temperature, each filter on or off, and combinations."""
    if greedy is None:
        greedy = draw(st.booleans())
    return SamplingParams(
        temperature=0.0 if greedy else draw(temperatures),
        top_k=draw(st.one_of(st.just(0), st.integers(1, 14))),
        top_p=draw(st.one_of(st.just(1.0), st.floats(0.01, 1.0), st.sampled_from([0.5, 0.9]))),
        min_p=draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.sampled_from([0.05, 0.5, 1.0]))),
    )


def base_distribution(x: np.ndarray, temperature: float) -> np.ndarray:
    """Reference: the temperature-only softmax the filters start from (same float ops as
    ``process``, so ties and underflows are the ones the filters see)."""
    probs = np.exp((x - x.max()) / temperature)
    return probs / probs.sum()


def descending(probs: np.ndarray) -> np.ndarray:
    """Token ids by descending probability, ties by ascending id (the documented order)."""
    return np.lexsort((np.arange(probs.size), -probs))


def assert_probability_vector(probs: np.ndarray, n: int) -> None:
    assert probs.shape == (n,) and probs.dtype == np.float64
    assert np.isfinite(probs).all() and (probs >= 0).all()
    assert abs(probs.sum() - 1.0) < 1e-9


# ---------------------------------------------------------------------------------------------
# Sampler


@PROPS
@given(logit_rows(), sampling_params())
def test_output_is_a_distribution_supported_on_finite_logits(x, params):
    before = x.copy()
    probs = process(x, params)
    assert_probability_vector(probs, x.size)
    support = probs > 0
    assert support.any()
    assert np.isfinite(x[support]).all()  # -inf logits never get mass
    np.testing.assert_array_equal(x, before)  # the caller's logits are not modified


@PROPS
@given(logit_rows(), sampling_params(greedy=False))
def test_filters_only_remove_tokens_and_renormalise_once(x, params):
    # Whatever the filters keep keeps its temperature-only probability, up to one common factor;
    # and the most likely token (lowest id on ties) always survives every filter.
    base = base_distribution(x, params.temperature)
    probs = process(x, params)
    support = probs > 0
    assert set(np.flatnonzero(support)) <= set(np.flatnonzero(base > 0))
    np.testing.assert_allclose(probs[support], base[support] / base[support].sum(), rtol=1e-9)
    assert probs[descending(base)[0]] > 0


@PROPS
@given(logit_rows(), st.integers(1, 14), temperatures)
@example(np.array([-INF, -INF, 0.0, 0.0]), 1, 1.0)  # argpartition used to keep id 3 here
@example(np.zeros(8), 3, 1.0)
def test_top_k_keeps_the_k_most_likely_lowest_ids_on_ties(x, k, temperature):
    base = base_distribution(x, temperature)
    probs = process(x, SamplingParams(temperature=temperature, top_k=k))
    kept = set(np.flatnonzero(probs > 0))
    # exactly the first k in (descending probability, ascending id) order that have any mass
    expected = {int(i) for i in descending(base)[:k] if base[i] > 0}
    assert kept == expected
    assert len(kept) == min(k, int((base > 0).sum()))
    dropped = set(np.flatnonzero(base > 0)) - kept
    for i in kept:
        for j in dropped:
            assert base[i] > base[j] or (base[i] == base[j] and i < j)


@PROPS
@given(logit_rows(), st.floats(0.01, 0.999), temperatures)
@example(np.zeros(3000), 0.1, 1.0)  # ties across the 1024-candidate window: ids 0..299 win
def test_top_p_keeps_the_smallest_prefix_reaching_p(x, top_p, temperature):
    base = base_distribution(x, temperature)
    probs = process(x, SamplingParams(temperature=temperature, top_p=top_p))
    support = probs > 0
    order = descending(base)
    m = int(support.sum())
    # the kept set is a prefix of the descending order (so ties at the cut go to the lowest ids)
    assert set(np.flatnonzero(support)) == set(order[:m].tolist())
    kept_mass = base[order[:m]].sum()
    assert kept_mass >= top_p * base.sum() - 1e-12  # it reaches p ...
    assert kept_mass - base[order[m - 1]] < top_p * base.sum() + 1e-12  # ... one fewer does not


@PROPS
@given(logit_rows(), st.floats(0.0, 1.0) | st.sampled_from([0.5, 1.0]), temperatures)
def test_min_p_keeps_tokens_within_a_fraction_of_the_top(x, min_p, temperature):
    base = base_distribution(x, temperature)
    probs = process(x, SamplingParams(temperature=temperature, min_p=min_p))
    np.testing.assert_array_equal(probs > 0, (base > 0) & (base >= min_p * base.max()))


class _OneRowModel:
    """A draft model whose next-token logits are always one fixed row."""

    def __init__(self, row: np.ndarray) -> None:
        self.row, self.n_ctx, self.tokens = row, 1 << 20, []

    def sync(self, prefix):
        return 0

    def decode(self, tokens, n_logits):
        return self.row[None, :]


@PROPS
@given(logit_rows(), sampling_params(greedy=True), st.integers(0, 2**32 - 1))
def test_greedy_is_one_hot_on_the_first_argmax_for_draft_and_target(x, params, seed):
    # Filters do not matter at temperature 0: the target row is one-hot on np.argmax (the lowest
    # id among tied maxima), sampling from it is deterministic, and the model drafter's greedy
    # shortcut picks the same token, so greedy drafts are accepted exactly when they agree.
    top = int(np.argmax(x))
    assert x[top] == x.max() and not (x[:top] == x.max()).any()
    probs = process(x, params)
    expected = np.zeros(x.size)
    expected[top] = 1.0
    np.testing.assert_array_equal(probs, expected)
    assert sample(probs, make_rng(seed)) == top
    drafted = ModelDrafter(_OneRowModel(x), x.size).propose([0], 1, params, make_rng(seed))
    assert (drafted.tokens, drafted.q) == ([top], [None])


@PROPS
@given(
    st.lists(st.integers(-512, 512), min_size=1, max_size=12),
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.integers(-1000, 1000),
    sampling_params(),
)
def test_adding_a_constant_to_every_logit_changes_nothing(ints, banned, shift, params):
    # Logits on a 1/8 grid shifted by an integer: every sum and difference is exact in float64,
    # so the processed distribution must be bit-identical.
    x = np.array(ints, dtype=np.float64) / 8
    x[np.array(banned[: x.size])] = -INF
    assume(np.isfinite(x).any())
    np.testing.assert_array_equal(process(x + shift, params), process(x, params))


@PROPS
@given(
    st.lists(st.floats(-100, 100), min_size=1, max_size=12),
    st.floats(-100, 100),
    st.floats(0.1, 5.0),
)
def test_adding_any_constant_changes_temperature_sampling_only_by_rounding(xs, shift, t):
    x, params = np.array(xs), SamplingParams(temperature=t)
    np.testing.assert_allclose(process(x + shift, params), process(x, params), rtol=1e-9,
                               atol=1e-12)


@PROPS
@given(logit_rows(minus_inf=True), sampling_params(), st.data())
def test_nan_logits_raise_a_clear_value_error(x, params, data):
    idx = data.draw(st.sets(st.integers(0, x.size - 1), min_size=1))
    x[list(idx)] = np.nan
    with pytest.raises(LogitsError, match="logits contain NaN"):
        process(x, params)
    with np.errstate(over="ignore"), pytest.raises(LogitsError, match="logits contain NaN"):
        process(x.astype(np.float32), params)  # llama.cpp hands over float32 rows


@PROPS
@given(st.integers(1, 12), sampling_params())
def test_all_minus_inf_logits_raise_a_clear_value_error(n, params):
    with pytest.raises(LogitsError, match="every logit is -inf: no token can be sampled"):
        process(np.full(n, -INF), params)


@PROPS
@given(logit_rows(), st.data(), sampling_params())
def test_plus_inf_logits_take_all_the_mass_and_still_obey_the_mode(x, data, params):
    # +inf is the limit of ever larger logits: the temperature-only distribution is uniform over
    # the +inf entries, and greedy and the filters then act on it as on any tie.
    idx = sorted(data.draw(st.sets(st.integers(0, x.size - 1), min_size=1)))
    x[idx] = INF
    probs = process(x, params)
    assert_probability_vector(probs, x.size)
    support = np.flatnonzero(probs > 0).tolist()
    if params.greedy:
        assert support == [idx[0]]
    else:
        n_keep = len(idx) if not params.top_k else min(params.top_k, len(idx))
        if params.top_p < 1.0:
            n_keep = min(n_keep, max(1, math.ceil(params.top_p * n_keep - 1e-12)))
        assert support == idx[:n_keep]  # the lowest ids among the tied +inf entries
        np.testing.assert_allclose(probs[support], 1.0 / n_keep, rtol=1e-12)


@FEW
@given(logit_rows(), sampling_params(), st.integers(0, 2**32 - 1))
def test_sample_only_returns_tokens_in_the_support(x, params, seed):
    probs = process(x, params)
    rng = make_rng(seed)
    assert all(probs[sample(probs, rng)] > 0 for _ in range(20))


# ---------------------------------------------------------------------------------------------
# Exact rejection step


class ScriptedUniforms:
    """An rng whose first ``random()`` draws are scripted; later ones come from a real rng."""

    def __init__(self, *uniforms: float, seed: int = 0) -> None:
        self.uniforms = list(uniforms)
        self.rng = make_rng(seed)

    def random(self) -> float:
        return self.uniforms.pop(0) if self.uniforms else self.rng.random()


def accepted(x: int, q: np.ndarray | None, p: np.ndarray, u: float) -> bool:
    """Does verify() accept draft x when its acceptance uniform is u?"""
    return verify([x], [q], [p, p], ScriptedUniforms(u)).n_accepted == 1


def accept_probability(x: int, q: np.ndarray | None, p: np.ndarray) -> float:
    """verify()'s own acceptance probability for draft x: the measure of the uniforms u in
    [0, 1) it accepts, found by bisection (acceptance must be monotone: checked here)."""
    if accepted(x, q, p, np.nextafter(1.0, 0.0)):
        return 1.0
    if not accepted(x, q, p, 0.0):
        return 0.0
    lo, hi = 0.0, 1.0  # accepted at lo, rejected at hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if accepted(x, q, p, mid):
            lo = mid
        else:
            hi = mid
    u = np.random.default_rng(0).uniform(0, lo, size=4)  # monotone: below the threshold accepts
    assert all(accepted(x, q, p, float(v)) for v in u)
    return hi


@st.composite
def distributions(draw, n, *, allow_one_hot=True):
    """A probability vector over n tokens: random weights with zeros and ties, a processed row of
    logits, or one-hot.

    Subnormal probabilities (< 2.2e-308) are flushed to zero: for a draft that improbable,
    verify()'s ``u * q(x) < p(x)`` loses precision (e.g. p == q == 5e-324 is rejected half the
    time), which has no effect on any real run, as such a draft is never sampled.
    """
    kind = draw(st.sampled_from(["weights", "one-hot", "logits"] if allow_one_hot
                                else ["weights", "logits"]))
    if kind == "one-hot":
        w = np.zeros(n)
        w[draw(st.integers(0, n - 1))] = 1.0
    elif kind == "logits":
        w = process(draw(logit_rows(min_size=n, max_size=n)), draw(sampling_params()))
    else:
        w = np.array(draw(st.lists(
            st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.sampled_from([0.25, 0.5, 1e-30])),
            min_size=n, max_size=n)))
    assume(w.sum() > 0)
    w = w / w.sum()
    w[w < np.finfo(np.float64).tiny] = 0.0
    return w / w.sum()


@st.composite
def pq_pairs(draw):
    n = draw(st.integers(1, 6))
    return draw(distributions(n)), draw(distributions(n))


def emitted_marginal(p: np.ndarray, q: np.ndarray | None, x_one_hot: int | None = None):
    """The exact distribution of verify()'s first emitted token, from its own accept
    probabilities and residuals: sum_x q(x) [beta(x) 1{y = x} + (1 - beta(x)) residual_x(y)]."""
    marginal = np.zeros(p.size)
    drafts = [(x_one_hot, 1.0)] if q is None else [(x, q[x]) for x in np.flatnonzero(q > 0)]
    for x, weight in drafts:
        beta = accept_probability(int(x), q, p)
        marginal[x] += weight * beta
        marginal += weight * (1.0 - beta) * residual(p, q, int(x))
    return marginal


@FEW
@given(pq_pairs())
def test_accept_probability_is_min_one_p_over_q(pq):
    p, q = pq
    for x in np.flatnonzero(q > 0):
        assert accept_probability(int(x), q, p) == pytest.approx(min(1.0, p[x] / q[x]), abs=1e-12)


@FEW
@given(pq_pairs())
def test_residual_is_the_normalised_positive_part_of_p_minus_q(pq):
    p, q = pq
    excess = np.maximum(p - q, 0.0)
    for x in range(p.size):
        r = residual(p, q, x)
        assert_probability_vector(r, p.size)
        if excess.sum() > 0:
            np.testing.assert_allclose(r, excess / excess.sum(), rtol=1e-12, atol=1e-300)
        else:  # no residual mass: a rejection had probability 0, the fallback is p itself
            np.testing.assert_array_equal(r, p)


@FEW
@given(pq_pairs())
def test_emitted_token_marginal_is_exactly_the_target(pq):
    p, q = pq
    np.testing.assert_allclose(emitted_marginal(p, q), p, atol=1e-12)


@FEW
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(distributions(n), st.integers(0, n - 1))))
def test_one_hot_draft_marginal_is_exactly_the_target(px):
    # A deterministic (lookup) draft x is proposed with q = one_hot(x), passed as None.
    p, x = px
    assert accept_probability(x, None, p) == pytest.approx(p[x], abs=1e-12)
    np.testing.assert_allclose(emitted_marginal(p, None, x), p, atol=1e-12)
    # None is shorthand for the explicit one-hot vector: same residual, same acceptance
    one_hot = np.zeros(p.size)
    one_hot[x] = 1.0
    np.testing.assert_allclose(residual(p, None, x), residual(p, one_hot, x), atol=1e-15)
    assert accept_probability(x, one_hot, p) == pytest.approx(p[x], abs=1e-12)


@FEW
@given(st.integers(1, 6).flatmap(distributions), st.floats(0.0, 1.0, exclude_max=True))
def test_draft_equal_to_target_is_never_rejected(p, u):
    for x in np.flatnonzero(p > 0):
        assert accepted(int(x), p, p.copy(), u)
        assert accepted(int(x), p, p.copy(), float(np.nextafter(1.0, 0.0)))


@FEW
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    distributions(n, allow_one_hot=False), st.sets(st.integers(0, n - 1), min_size=1,
                                                   max_size=n - 1))),
    st.integers(0, 2**32 - 1))
def test_disjoint_supports_always_reject_and_resample_from_p(pd, seed):
    # q lives where p has no mass: every draft is rejected and the replacement is drawn from p.
    w, draft_ids = pd
    draft_ids = sorted(draft_ids)
    p = w.copy()
    p[draft_ids] = 0.0
    assume(p.sum() > 0)
    p /= p.sum()
    q = np.zeros(p.size)
    q[draft_ids] = 1.0 / len(draft_ids)
    for x in draft_ids:
        assert accept_probability(x, q, p) == 0.0
        np.testing.assert_allclose(residual(p, q, x), p, rtol=1e-12)
        v = verify([x], [q], [p, p], make_rng(seed))
        assert v.n_accepted == 0 and v.next_source is Source.CORRECTED and p[v.next_token] > 0


@FEW
@given(pq_pairs(), st.integers(0, 2**32 - 1))
def test_tokens_q_misses_are_reached_only_through_the_residual(pq, seed):
    # Where q(y) = 0 < p(y), y cannot be drafted: all its target mass must come from rejections.
    p, q = pq
    missed = (q == 0) & (p > 0)
    assume(missed.any())
    beta = {int(x): accept_probability(int(x), q, p) for x in np.flatnonzero(q > 0)}
    reject_mass = sum(q[x] * (1 - b) for x, b in beta.items())
    for x in beta:
        r = residual(p, q, x)
        np.testing.assert_allclose(reject_mass * r[missed], p[missed], rtol=1e-9, atol=1e-12)
        v = verify([x], [q], [p, p], make_rng(seed))
        if v.n_accepted == 0:
            assert r[v.next_token] > 0 and q[v.next_token] < p[v.next_token]


# ---------------------------------------------------------------------------------------------
# Prompt lookup

streams = st.lists(st.integers(0, 2), max_size=30) | st.lists(st.integers(0, 5), max_size=30)
ngram_bounds = st.tuples(st.integers(1, 5), st.integers(0, 4)).map(lambda t: (t[0], t[0] + t[1]))


def brute_force(tokens, max_ngram, min_ngram, max_tokens):
    """Reference lookup: the longest n in [min, max] whose suffix occurs earlier followed by at
    least one token; the most recent such occurrence; up to max_tokens of what followed."""
    if max_tokens <= 0 or min_ngram < 1:
        return None
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return LookupMatch(tokens[start + n:start + n + max_tokens], n)
    return None


def recurs(tokens, n):
    """Does the length-n suffix occur earlier, with a token after it?"""
    suffix = tokens[len(tokens) - n:]
    return 0 < n < len(tokens) and any(
        tokens[i:i + n] == suffix for i in range(len(tokens) - n))


@PROPS
@given(streams, ngram_bounds, st.integers(1, 10))
def test_lookup_proposes_what_followed_an_earlier_occurrence(tokens, bounds, max_tokens):
    min_ngram, max_ngram = bounds
    match = find_continuation(tokens, max_ngram=max_ngram, min_ngram=min_ngram,
                              max_tokens=max_tokens)
    if match is None:
        # no proposal exactly when no suffix n-gram of an allowed length recurs
        assert not any(recurs(tokens, n) for n in range(min_ngram, max_ngram + 1))
        return
    n, proposal = match.ngram, match.tokens
    assert min_ngram <= n <= max_ngram
    assert 1 <= len(proposal) <= max_tokens
    assert all(type(t) is int for t in proposal)
    suffix = tokens[len(tokens) - n:]
    assert any(  # the proposal really follows an earlier occurrence of the suffix n-gram
        tokens[i:i + n] == suffix and tokens[i + n:i + n + len(proposal)] == proposal
        for i in range(len(tokens) - n))
    # the longest recurring n-gram wins
    assert not any(recurs(tokens, m) for m in range(n + 1, max_ngram + 1))


@PROPS
@given(streams, ngram_bounds, st.integers(-1, 10))
def test_lookup_matches_the_brute_force_reference(tokens, bounds, max_tokens):
    min_ngram, max_ngram = bounds
    expected = brute_force(tokens, max_ngram, min_ngram, max_tokens)
    kwargs = dict(max_ngram=max_ngram, min_ngram=min_ngram, max_tokens=max_tokens)
    assert find_continuation(tokens, **kwargs) == expected
    assert find_continuation(np.array(tokens, dtype=np.int32), **kwargs) == expected


@PROPS
@given(streams, ngram_bounds, st.integers(0, 10))
def test_lookup_drafter_proposes_the_continuation_as_one_hot_drafts(tokens, bounds, k):
    min_ngram, max_ngram = bounds
    draft = LookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram).propose(
        tokens, k, SamplingParams(), make_rng(0))
    expected = brute_force(tokens, max_ngram, min_ngram, k)
    assert draft.source == "lookup"
    if expected is None:
        assert (draft.tokens, draft.q) == ([], [])
    else:
        assert (draft.tokens, draft.ngram) == (expected.tokens, expected.ngram)
        assert draft.q == [None] * len(draft.tokens) and 1 <= len(draft.tokens) <= k


@PROPS
@given(streams, streams)
def test_common_prefix_is_the_longest_common_prefix(proposal, actual):
    m = common_prefix(proposal, actual)
    assert 0 <= m <= min(len(proposal), len(actual))
    assert proposal[:m] == actual[:m]
    assert m == min(len(proposal), len(actual)) or proposal[m] != actual[m]


@PROPS
@given(streams, ngram_bounds, st.integers(1, 10))
def test_periodic_text_proposals_are_always_right(tokens, bounds, max_tokens):
    # Once text repeats with a period p >= 1 and the suffix n-gram spans a whole period, the
    # proposal copies the period: continuing the repetition confirms every proposed token.
    min_ngram, max_ngram = bounds
    assume(len(tokens) >= 1)
    period = tokens[: min(max_ngram, 1 + len(tokens) % 4)]
    text = (period * (max_ngram + 3))[: len(period) * (max_ngram + 2) + len(tokens) % 3]
    match = find_continuation(text, max_ngram=max_ngram, min_ngram=min_ngram,
                              max_tokens=max_tokens)
    assert match is not None and match.ngram == max_ngram
    future = (period * (len(text) + max_tokens))[len(text): len(text) + max_tokens]
    assert common_prefix(match.tokens, future) == len(match.tokens)
