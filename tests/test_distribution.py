"""The lean sampling path (``distribution``, :mod:`edgespec.core.dist`, ``sample_residual``)
against the dense reference (``process``, ``sample``, ``residual``).

Supports must be equal; where a filter's decision sits exactly on its threshold, the two may
round it differently, so a difference is accepted only if moving the thresholds by 1e-9 (top-p
mass, min-p ratio) explains it. Probabilities must agree to float rounding. Statistical tests
use fixed seeds; each uses chi-square at ALPHA (tests/stats_util.py) with 20,000 draws, enough
that a sampler off by a few percent on any outcome with expected count >= 5 fails.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edgespec.core import dist, rejection, sampling
from edgespec.core.dist import Dense, Exact, OneHot, Sparse, Truncated
from edgespec.core.rejection import residual, sample_residual, verify
from edgespec.core.sampling import SamplingParams, distribution, process, sample
from edgespec.errors import LogitsError

from .stats_util import ALPHA, chi2_pvalue

N_DRAWS = 20_000

values = st.one_of(
    st.floats(-30, 30, width=32),
    st.sampled_from([0.0, 1.0, 2.5, -np.inf]),  # ties and impossible tokens
)
rows = st.lists(values, min_size=1, max_size=120).map(lambda v: np.array(v, np.float32))
params_st = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.25, 0.8, 1.0, 3.0]),
    top_k=st.sampled_from([0, 1, 2, 5, 40]),
    top_p=st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
)


def _shifted(params: SamplingParams, delta: float) -> SamplingParams:
    """Thresholds moved by ``delta`` towards a larger support."""
    return SamplingParams(params.temperature, params.top_k, min(1.0, params.top_p + delta),
                          min(1.0, max(0.0, params.min_p - delta)))


def assert_same(row: np.ndarray, params: SamplingParams, rtol: float = 1e-9,
                delta: float = 1e-9) -> None:
    ref = process(row, params)
    got = distribution(row, params).dense()
    if not np.array_equal(ref > 0, got > 0):
        small = process(row, _shifted(params, -delta)) > 0
        large = process(row, _shifted(params, delta)) > 0
        assert np.all(small <= (got > 0)) and np.all((got > 0) <= large), "supports differ"
        return
    # atol: a probability below 2**-53 cannot be drawn by any float64 inverse-CDF sampler
    # (float32 weights that small are subnormal and keep few digits)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-17)


@settings(max_examples=400, deadline=None)
@given(rows, params_st)
@example(np.zeros(7, np.float32), SamplingParams(temperature=1.0, top_k=3))  # ties at the cut
@example(np.zeros(10, np.float32), SamplingParams(temperature=1.0, top_p=0.5))
@example(np.array([0, np.inf, 1, np.inf], np.float32), SamplingParams(temperature=0.8, top_k=1))
@example(np.array([np.inf], np.float32), SamplingParams(temperature=0.0))
@example(np.array([-np.inf, 3, -np.inf], np.float32), SamplingParams(temperature=1.0, top_k=2))
# a tie exactly at the top-p cut that only the 9e-8 weight of the token outside min-p decides
# (a float32 total rounds it away: found by this test)
@example(np.array([0, 13, 13], np.float32), SamplingParams(temperature=0.8, top_p=0.5, min_p=0.05))
def test_distribution_equals_the_dense_reference(row, params):
    if np.all(row == -np.inf):
        with pytest.raises(LogitsError):
            distribution(row, params)
        return
    # The untruncated path computes its weights in float32: exp's argument (x - top) / T is
    # rounded to ~6e-8 of itself, so a weight 30 temperatures down is off by ~2e-6 relative.
    truncated = (0 < params.top_k < row.size or params.top_p < 1 or params.min_p > 0
                 or params.greedy)
    assert_same(row, params, rtol=1e-9 if truncated else 1e-5)


# rows whose logits lie close together: many tokens per 1/8-octave bin of weight, so cuts land
# inside bins and next to them
close_rows = st.lists(st.one_of(st.floats(-1, 1, width=32), st.sampled_from([0.0, 0.5, -np.inf])),
                      min_size=1, max_size=200).map(lambda v: np.array(v, np.float32))


@settings(max_examples=600, deadline=None)
@given(st.one_of(rows, close_rows).filter(lambda r: np.any(r > -np.inf)),
       params_st.filter(lambda p: not p.greedy), st.sampled_from([1, 3, 8]),
       st.sampled_from([(4096, 24), (16, 1), (8, 0), (32, 2), (0, 0)]), st.booleans())
@example(np.zeros(40, np.float32), SamplingParams(temperature=1.0, top_p=0.5), 1, (0, 0),
         True)  # one bin
@example(np.array([2.5] * 9 + [0.0] * 30, np.float32), SamplingParams(temperature=1.0, top_p=0.3),
         3, (0, 0), True)  # the cut inside a tie
@example(np.linspace(0, -0.5, 100).astype(np.float32), SamplingParams(temperature=1.0, top_p=0.25),
         1, (0, 0), False)  # the nucleus just past the candidates: 21 tokens, 20 candidates
@example(np.array([0.0, -2.220446049250313e-16, 0.0], np.float32),
         SamplingParams(temperature=3.0, top_p=0.5), 1, (4096, 24), True)  # weights 1 ulp apart
@example(np.array([0.0 if i % 2 == 0 else -3 - 0.01 * i for i in range(200)], np.float32),
         SamplingParams(temperature=1.0, top_p=0.99), 1, (100, 0), False)  # the sample (even
# ids) sees no light token: the guessed band is above the cut, the check must send it to the bins
@example(np.array([0.0] * 17 + [1.0, -1.401298464324817e-45, 0.0, 1.0], np.float32),
         SamplingParams(temperature=0.25, top_p=0.99), 1, (4096, 24), False)  # a logit of
# -1e-45 weighs what 0 does, and the cut lies inside that tie: top-p's candidates (logits at
# or above a guessed 0) must take it, so that the tie goes to the lower id as in the reference
# (found by this test in CI)
def test_wide_row_paths_equal_the_dense_reference(row, params, guess, bracket, key_sort):
    # Small rows made to take the paths of a wide one: every row counts as wide, and top-p
    # first looks among `guess` most likely tokens, then (a flat row) brackets the cut from a
    # strided sample of `bracket[0]` weights, `bracket[1]` sample ranks either side, and if
    # that fails bins the float32 weights (a sample of 0: always the bins). `key_sort`: every
    # descending order, however short, by the integer key instead of lexsort, and top-p's
    # candidates ordered from a head of 2 (the whole order only if the cut is past it).
    sample_size, ranks = bracket
    with pytest.MonkeyPatch.context() as mp:
        if key_sort:
            mp.setattr(sampling, "_KEY_SORT_FROM", 0)
            mp.setattr(sampling, "_ORDER_HEAD", 2)
        mp.setattr(sampling, "_MAX_CANDIDATES", 0)  # no min-p shortcut
        mp.setattr(sampling, "_NUCLEUS_GUESS", guess)
        mp.setattr(sampling, "_SAMPLE", max(sample_size, 1))
        if not sample_size:
            mp.setattr(sampling, "_bracketed", lambda *a: None)
        mp.setattr(sampling, "_BRACKET", ranks)
        got = distribution(row, params)
        rtol = 1e-5 if isinstance(got, (Dense, Truncated)) else 1e-9
        assert_same(row, params, rtol=rtol, delta=1e-6)


key_rows = st.lists(st.one_of(st.floats(-3, 3, width=32),
                              st.sampled_from([0.0, -0.0, 1.0, -np.inf])),
                    min_size=1, max_size=300).map(lambda v: np.array(v, np.float32))


@settings(max_examples=300, deadline=None)
@given(key_rows, st.sampled_from([0.001, 0.01, 0.8, 3.0]), st.integers(0, 2**32 - 1))
@example(np.array([0.0, -0.0, 0.0, -0.0], np.float32), 0.8, 0)  # one logit, two zeros
# two logits 1 ulp apart, 0.74 below the top at T 0.001: float64 exp rounds both onto one
# subnormal weight, and lexsort gives that tie to the lower id (here the lighter logit)
@example(np.array([0.0, np.nextafter(np.float32(-0.74), np.float32(-1)), np.float32(-0.74)],
                  np.float32), 0.001, 0)
def test_the_integer_key_orders_like_lexsort(row, t, seed):
    # _descending_order's key sort against the two-key lexsort it replaces, on ties, -0.0,
    # -inf and weights that float64 rounds together, over a random subset of ids
    rng = np.random.default_rng(seed)
    ids = np.flatnonzero(rng.random(row.size) < 0.7)
    top = float(row.max())
    if ids.size == 0 or top == -np.inf:
        return
    w = sampling._weights(row, ids, top, t)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling, "_KEY_SORT_FROM", 0)
        got = sampling._descending_order(row, ids, w)
    np.testing.assert_array_equal(got, np.lexsort((ids, -w)))


@settings(max_examples=300, deadline=None)
@given(key_rows, st.sampled_from([0.01, 0.8, 3.0]), st.integers(1, 40))
def test_the_head_of_the_order_is_the_orders_beginning(row, t, head):
    # ties at the head's end included: the head is a prefix of the whole order, at least
    # `head` long (when the candidates are many more)
    top = float(row.max())
    if top == -np.inf:
        return
    ids = np.arange(row.size)
    w = sampling._weights(row, ids, top, t)
    whole = sampling._descending_order(row, ids, w)
    got = sampling._descending_order(row, ids, w, head)
    if row.size > 4 * head:
        assert got.size >= head
    np.testing.assert_array_equal(got, whole[: got.size])


def test_the_integer_key_is_used_for_long_candidate_sets(monkeypatch):
    row = np.random.default_rng(3).normal(0, 2, 4000).astype(np.float32)
    row[::7] = row[3]  # ties
    ids = np.arange(row.size)
    w = sampling._weights(row, ids, float(row.max()), 0.8)
    monkeypatch.setattr(np, "lexsort", None)  # (the key path must not reach it)
    got = sampling._descending_order(row, ids, w)
    monkeypatch.undo()
    np.testing.assert_array_equal(got, np.lexsort((ids, -w)))


def test_a_bracket_that_misses_leaves_the_weights_whole(monkeypatch):
    # the sample (even ids) sees no light token, so the band it guesses lies above the cut: the
    # check fails after the weights below the band were dropped in place, and they must be back
    # for the bins that take over
    row = np.array([0.0 if i % 2 == 0 else -3 - 0.01 * i for i in range(200)], np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.99)
    monkeypatch.setattr(sampling, "_SAMPLE", 100)
    monkeypatch.setattr(sampling, "_BRACKET", 0)
    d = sampling._dense(row, 0.0, 1.0, row.size)
    whole = d.w.copy()
    dropped = []
    monkeypatch.setattr(sampling, "block_sums",
                        lambda w: dropped.append(int(np.sum(w == 0))) or dist.block_sums(w))
    assert sampling._bracketed(row, d, 0.0, params, row.size) is None
    assert dropped and dropped[0] > whole.size - row.size  # (it did drop some before the check)
    np.testing.assert_array_equal(d.w, whole)


def test_a_bracket_that_misses_tries_a_wider_band_before_the_bins(monkeypatch):
    # row 54 of the overhead bench's pool: its sample puts the cut more than 24 ranks too low
    # (the estimate of the tail's mass is off by a few percent); 4x as many ranks hold it, and
    # the bins (~2.5 ms) are not needed
    from edgespec.bench.overhead import make_pools

    row = make_pools(151_936)[0][54]
    params = SamplingParams(temperature=0.8, top_p=0.95)
    restored = []
    dense_into = sampling._dense_into
    monkeypatch.setattr(sampling, "_dense_into", lambda *a: restored.append(1) or dense_into(*a))
    monkeypatch.setattr(sampling, "_binned", None)
    got = distribution(row, params)
    assert isinstance(got, Truncated)
    assert isinstance(got.listed(), Dense)
    # the weights (through _dense_into unless the compiled pass made them in _dense), then
    # once more after the first band missed
    assert len(restored) == (1 if sampling._ROWS is not None else 2)
    assert_same(row, params, rtol=1e-5, delta=1e-6)


def test_nan_logits_raise():
    row = np.array([0.0, np.nan, 1.0], np.float32)
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=1, top_k=2)):
        with pytest.raises(LogitsError, match="NaN"):
            distribution(row, params)


def test_forms():
    row = np.array([0.0, 3.0, 3.0, 1.0], np.float32)
    assert isinstance(distribution(row, SamplingParams(temperature=0)), OneHot)
    assert distribution(row, SamplingParams(temperature=0)).token == 1  # lowest id of the tie
    assert isinstance(distribution(row, SamplingParams(temperature=1, top_k=2)), Sparse)
    assert isinstance(distribution(row, SamplingParams(temperature=1)), Dense)
    # a shorter (draft) row over a larger vocabulary: ids past it have probability 0
    d = distribution(row, SamplingParams(temperature=1), n_vocab=10)
    assert d.dense().shape == (10,) and d.prob(9) == 0.0


def vocab_row(n: int = 151_936, seed: int = 0, top: float = 14.0) -> np.ndarray:
    """A row shaped like a real model's: N(0, 2) bulk and a few high logits."""
    rng = np.random.default_rng(seed)
    row = rng.normal(0, 2, n).astype(np.float32)
    row[rng.choice(n, 6, replace=False)] = top - np.array([0, 1, 1.8, 2.5, 3, 3.4])
    return row


#: the overhead bench's sampling settings, for rows of the default vocabulary
VOCAB_MODES = {"t0.8": SamplingParams(temperature=0.8),
               "top_k40": SamplingParams(temperature=0.8, top_k=40),
               "top_p0.95": SamplingParams(temperature=0.8, top_p=0.95),
               "min_p0.05": SamplingParams(temperature=0.8, min_p=0.05),
               "all": SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02)}


@pytest.mark.parametrize("top", [9.0, 14.0, 20.0])  # flat (wide nucleus) to confident
@pytest.mark.parametrize("mode", VOCAB_MODES)
def test_full_vocabulary_rows(top, mode):
    params = VOCAB_MODES[mode]
    # float32 weights (see above) for plain temperature and for top-p's flat rows (whose
    # nucleus is most of the vocabulary: kept dense, the dropped weights zeroed); top-p over a
    # very wide candidate set takes its total from the float32 pass, so its cut may move by
    # 1e-6 of the mass
    row = vocab_row(top=top)
    with pytest.MonkeyPatch.context() as mp:
        # the flat row's cut is found by the bracket, not the bins' fallback
        mp.setattr(sampling, "_binned", None)
        dense = isinstance(distribution(row, params), (Dense, Truncated))
        assert dense == (mode == "t0.8" or (mode == "top_p0.95" and top == 9.0))
        assert_same(row, params, rtol=1e-5 if dense else 1e-9, delta=1e-6)


@settings(max_examples=400, deadline=None)
@given(st.one_of(rows, close_rows, key_rows).filter(lambda r: np.any(r > -np.inf)),
       params_st.filter(lambda p: not p.greedy), st.sampled_from([1, 3, 8]), st.booleans())
@example(np.zeros(40, np.float32), SamplingParams(temperature=1.0, top_k=5), 4, False)  # all tied
@example(np.array([0, 5, 0, 5, 0, 5, 0, 5, 1], np.float32), SamplingParams(temperature=1.0, top_k=2),
         4, False)  # the top logits in one column, one past the grid
@example(np.array([1, 1, 1, 1, 9, 1, 1, 1, 2], np.float32), SamplingParams(temperature=1.0, top_k=2),
         2, True)  # the top_k-th logit only in the tail
@example(np.array([0.0, 1.0, 1.35e-31], np.float32), SamplingParams(temperature=0.25, top_k=2), 1,
         False)  # 0 and 1e-31 one weight in float64: the tie goes to id 0 (found by this test)
def test_column_maxima_find_the_same_candidates(row, params, slices, window):
    # Small rows made to take the long rows' path: `slices` slices side by side, any width
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling, "_SLICES", slices)
        mp.setattr(sampling, "_MIN_COLUMNS", 1)
        if window:
            assert_same_window(row, params, 3)
        else:
            rtol = 1e-5 if isinstance(distribution(row, params), (Dense, Truncated)) else 1e-9
            assert_same(row, params, rtol=rtol, delta=1e-6)


@pytest.mark.parametrize("top", [9.0, 14.0, 20.0])
@pytest.mark.parametrize("k", [1, 40, 64, 3000])
def test_column_maxima_hold_the_top_k_and_the_min_p_support(top, k):
    row = vocab_row(top=top)
    row[7] = row[13] = row[151_935] = top - 1.0  # ties, one in the tail past the grid
    maxima = sampling._Maxima.of(row)
    assert maxima is not None and maxima.top == float(row.max())
    ids = maxima.top_ids(k, 0.8)
    assert np.all(np.diff(ids) > 0)
    kth = np.sort(row)[row.size - k]
    np.testing.assert_array_equal(ids, np.flatnonzero(row >= row[ids].min()))
    assert row[ids].min() <= kth  # every logit tied with the k-th is in
    for floor in (top - 0.5, top - 3.0, 2.0, -50.0):
        np.testing.assert_array_equal(maxima.at_least(floor), np.flatnonzero(row >= np.float32(floor)))


def test_column_maxima_see_a_nan_anywhere():
    for at in (5, 151_935):  # in the grid, in the tail
        row = vocab_row(top=14.0)
        row[at] = np.nan
        assert np.isnan(sampling._Maxima.of(row).top)
        with pytest.raises(LogitsError):
            distribution(row, SamplingParams(temperature=0.8, top_k=40))


# ---- a draft's window: its q is the row's `window` most likely tokens, processed -------------


def windowed(row: np.ndarray, window: int, t: float) -> np.ndarray:
    """The row with every logit below its ``window``-th largest (ties stay in), or below a
    weight of 1e-4 of the top one's at temperature ``t``, set to -inf."""
    if not 0 < window < row.size:
        return row
    floor = np.sort(row)[row.size - window]
    top = float(row.max())
    if np.isfinite(top):
        floor = max(floor, np.float32(top + t * np.log(1e-4)))
    return np.where(row >= floor, row, np.float32(-np.inf)).astype(np.float32)


def assert_same_window(row: np.ndarray, params: SamplingParams, window: int) -> None:
    """``draft_distribution`` equals the dense reference on the windowed row, as in
    :func:`assert_same` (a support may differ only where a threshold moved by 1e-9 explains it)."""
    # (top-k within the window: the row as it is, as documented; the window would keep the
    # same tokens but where two logits' weights round to one, which top-k then orders by id)
    masked = row if 0 < params.top_k <= window else windowed(row, window, params.temperature)
    got_dist = sampling.draft_distribution(row, params, window=window)
    got = got_dist.dense()
    ref = process(masked, params)
    if not np.array_equal(ref > 0, got > 0):
        small = process(masked, _shifted(params, -1e-9)) > 0
        large = process(masked, _shifted(params, 1e-9)) > 0
        assert np.all(small <= (got > 0)) and np.all((got > 0) <= large), "supports differ"
        return
    rtol = 1e-5 if isinstance(got_dist, (Dense, Truncated)) else 1e-9
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-17)


@settings(max_examples=400, deadline=None)
@given(st.one_of(rows, close_rows), params_st, st.sampled_from([1, 2, 3, 5, 200]))
@example(np.zeros(7, np.float32), SamplingParams(temperature=1.0), 3)  # the window's cut in a tie
@example(np.array([1, 2, 2, 2, 0], np.float32), SamplingParams(temperature=1.0, top_p=0.5), 2)
@example(np.array([-np.inf, 3, -np.inf, -np.inf], np.float32), SamplingParams(temperature=0.8), 2)
def test_a_windowed_draft_is_the_dense_reference_on_the_windowed_row(row, params, window):
    if np.all(row == -np.inf):
        with pytest.raises(LogitsError):
            sampling.draft_distribution(row, params, window=window)
        return
    assert_same_window(row, params, window)


@pytest.mark.parametrize("top", [9.0, 14.0, 20.0])
@pytest.mark.parametrize("mode", VOCAB_MODES)
def test_a_windowed_draft_on_full_vocabulary_rows_never_weighs_the_row(top, mode, monkeypatch):
    params = VOCAB_MODES[mode]
    row = vocab_row(top=top)
    want = process(row if 0 < params.top_k <= 64 else windowed(row, 64, params.temperature),
                   params)

    def refuse(*args, **kwargs):
        raise AssertionError("whole-row work for a windowed draft")

    for name in ("_dense", "_nucleus", "_dense_into"):
        monkeypatch.setattr(sampling, name, refuse)
    got = sampling.draft_distribution(row, params, window=64)
    assert isinstance(got, Sparse) and got.ids.size <= 64
    np.testing.assert_allclose(got.dense(), want, rtol=1e-9, atol=1e-17)


@pytest.mark.parametrize("mode", VOCAB_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_a_window_from_the_device_equals_the_hosts(mode, seed):
    # The backend hands its top-64 in any order (here shuffled), with ids past the target's
    # vocabulary (a draft's padding) among them: the same q as the host's window of the row
    # cut to the target's vocabulary.
    params = VOCAB_MODES[mode]
    row = vocab_row(seed=seed, top=[9.0, 14.0, 20.0][seed])
    n = row.size - 100
    row[n + 3] = row.max() + 1.0  # a padding id: not a token of the target
    top = np.argsort(-row, kind="stable")[:65]
    ids = np.random.default_rng(seed).permutation(top)
    got = sampling.window_distribution(ids, row[ids], params, n)
    want = sampling.draft_distribution(row[:n], params, n, window=64)
    np.testing.assert_allclose(got.dense(), want.dense(), rtol=1e-12, atol=0)


def test_a_window_from_the_device_raises_on_nan_and_on_no_token():
    ids = np.array([4, 2, 9])
    with pytest.raises(LogitsError):
        sampling.window_distribution(ids, np.array([1, np.nan, 0], np.float32),
                                     SamplingParams(temperature=0.8), 10)
    with pytest.raises(LogitsError):
        sampling.window_distribution(ids, np.array([1, 2, 0], np.float32),
                                     SamplingParams(temperature=0.8), 2)
    greedy = sampling.window_distribution(ids, np.array([1, 3, 3], np.float32),
                                          SamplingParams(temperature=0), 10)
    assert isinstance(greedy, OneHot) and greedy.token == 2  # a tie: the lowest id


def test_a_window_changes_nothing_where_top_k_fits_it_or_the_row_is_short():
    row = vocab_row(top=14.0)
    for params, window in [(SamplingParams(temperature=0.8, top_k=40), 64),
                           (SamplingParams(temperature=0.8, top_k=64, top_p=0.9), 64),
                           (SamplingParams(temperature=0.8), 0),
                           (SamplingParams(temperature=0.8), row.size)]:
        a = sampling.draft_distribution(row, params, window=window).dense()
        np.testing.assert_array_equal(a, distribution(row, params).dense())
    greedy = sampling.draft_distribution(row, SamplingParams(temperature=0), window=4)
    assert isinstance(greedy, OneHot) and greedy.token == int(np.argmax(row))


def test_a_windowed_draft_with_nan_logits_raises():
    row = vocab_row(top=14.0)
    row[5] = np.nan  # outside any window: found by the row's max all the same
    with pytest.raises(LogitsError):
        sampling.draft_distribution(row, SamplingParams(temperature=0.8), window=64)


def test_a_flat_row_skips_the_candidates(monkeypatch):
    # a wide nucleus (top 9: most of the weight in the bulk): the sample says so, and no pass
    # looks for candidates that could not hold it
    params = SamplingParams(temperature=0.8, top_p=0.95)
    row = vocab_row(top=9.0)

    def candidates_weighed(*args):
        raise AssertionError("the candidates were weighed")

    monkeypatch.setattr(sampling, "_high", candidates_weighed)
    got = distribution(row, params)
    assert isinstance(got, Truncated)
    monkeypatch.undo()
    assert_same(row, params, rtol=1e-5, delta=1e-6)
    # listed, its total is the kept weight, known without block sums (built only if it is
    # sampled)
    got = got.listed()
    assert got._blocks is None
    assert got.total == pytest.approx(float(got.w.sum(dtype=np.float64)), rel=1e-6)


@pytest.mark.parametrize("top", [14.0, 20.0])
def test_a_row_judged_flat_wrongly_still_gets_its_exact_nucleus(top, monkeypatch):
    # every row taken as flat (no head, and the columns of its wide head left unlisted): a
    # confident one then takes the flat path (its cut among the few heaviest tokens) and
    # must still be exact
    monkeypatch.setattr(sampling, "_MAX_HEAD", 0)  # (no confident row decided by its head)
    monkeypatch.setattr(sampling, "_WIDE_HEAD", 0)  # (nor by the columns that reach it)
    row = vocab_row(top=top)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    got = distribution(row, params)
    assert isinstance(got, Truncated)
    assert_same(row, params, rtol=1e-5, delta=1e-6)
    assert np.count_nonzero(got.dense()) == np.count_nonzero(process(row, params))


def test_top_k_candidates_look_deeper_when_the_sample_guesses_too_high(monkeypatch):
    # peaks planted where the strided sample looks (every 37th id of a 152k row): the sample's
    # 5th value, the first guess for k = 40, is a peak with fewer than 40 logits above it.
    # The candidates must still be a small superset (the whole row's sort costs ~18 ms), with
    # every other logit below their floor
    row = vocab_row(top=9.0)
    stride = row.size // 4096
    row[np.arange(8) * stride * 100] = 20.0 + np.arange(8, dtype=np.float32)
    ids, floor = sampling._top_candidates(row, 40)
    assert 40 <= ids.size < 4_000
    top40 = np.argsort(-row, kind="stable")[:40]
    assert np.isin(top40, ids).all()
    outside = np.ones(row.size, bool)
    outside[ids] = False
    assert row[outside].max() < floor <= row[ids].min()
    monkeypatch.setattr(sampling, "_descending_order", _refuse_wide(sampling._descending_order))
    assert_same(row, SamplingParams(temperature=0.8, top_k=40))


def _refuse_wide(order):
    def checked(x, ids, w):
        assert ids.size < 4_000, "sorted the whole row"
        return order(x, ids, w)
    return checked


@pytest.mark.parametrize("min_p", [0.0, 0.05])
def test_a_confident_row_finds_its_nucleus_without_weighing_the_whole_row(min_p, monkeypatch):
    # the weight outside ~1,000 candidates is bounded well enough to place the cut: no float32
    # pass over the vocabulary
    params = SamplingParams(temperature=0.8, top_p=0.95, min_p=min_p)
    row = vocab_row(top=20.0)

    def whole_row(*args):
        raise AssertionError("the whole row was weighed")

    monkeypatch.setattr(sampling, "_dense", whole_row)
    assert isinstance(distribution(row, params), Sparse)
    monkeypatch.undo()
    assert_same(row, params)


def test_the_bound_on_the_weight_outside_decides_or_refuses():
    # one candidate (weight 1) and 999 other tokens: whether it alone is the nucleus depends on
    # how heavy the others may be
    row = np.full(1000, -60.0, np.float32)
    row[0] = 0.0
    params = SamplingParams(temperature=1.0, top_p=0.5)
    ids, w = np.array([0]), np.array([1.0])
    # others below -60: together under 1e-23, the nucleus is the candidate
    got = sampling._bounded(row, 0.0, params, ids, w, -60.0, False, 1000)
    assert isinstance(got, Sparse) and got.ids.tolist() == [0]
    # others up to -5: they may weigh 999 * e**-5 = 6.7 > 1, so the cut may lie past the
    # candidate: not decided from the candidates
    assert sampling._bounded(row, 0.0, params, ids, w, -5.0, False, 1000) is None
    # the same as a min-p support (final): keeping every candidate is then the answer
    got = sampling._bounded(row, 0.0, SamplingParams(temperature=1.0, top_p=0.5, min_p=0.5),
                            ids, w, -5.0, True, 1000)
    assert isinstance(got, Sparse) and got.ids.tolist() == [0]
    # two candidates of weight 1 and 0.5, others up to -5 (at most 6.7): a top-p of 0.05 cuts
    # after the first token for any total from 1.5 to 8.2; 0.5 would not be decided
    row[1] = np.log(0.5)
    ids, w = np.array([0, 1]), np.array([1.0, 0.5])
    got = sampling._bounded(row, 0.0, SamplingParams(temperature=1.0, top_p=0.05), ids, w,
                            -5.0, False, 1000)
    assert isinstance(got, Sparse) and got.ids.tolist() == [0]
    assert sampling._bounded(row, 0.0, SamplingParams(temperature=1.0, top_p=0.9), ids, w,
                             -5.0, False, 1000) is None


class ScriptedRng:
    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


@given(rows.filter(lambda r: np.any(r > -np.inf)), st.floats(0, 1, exclude_max=True),
       st.sampled_from([5, 40]))
@settings(max_examples=200, deadline=None)
def test_sparse_sample_equals_reference_sample_for_the_same_uniform(row, u, k):
    params = SamplingParams(temperature=1.0, top_k=k)
    d = distribution(row, params)
    probs = d.dense()
    assert d.sample(ScriptedRng([u])) == sample(probs, ScriptedRng([u]))


def draws(fn, n=N_DRAWS, seed=0):
    rng = np.random.default_rng(seed)
    return Counter(fn(rng) for _ in range(n))


def as_expected(probs: np.ndarray) -> dict[int, float]:
    return {int(i): float(probs[i]) for i in np.flatnonzero(probs)}


def test_dense_sampling_follows_its_distribution():
    row = vocab_row(n=3000, top=6.0)  # mass spread over many blocks
    d = distribution(row, SamplingParams(temperature=1.0))
    assert isinstance(d, Dense)
    assert chi2_pvalue(draws(d.sample), as_expected(d.dense())) > ALPHA


def test_dense_sampling_catches_a_wrong_sampler():
    # negative control: the test above would notice a sampler that ignores the last block
    row = vocab_row(n=3000, top=6.0)
    d = distribution(row, SamplingParams(temperature=1.0))
    probs = d.dense()
    wrong = probs.copy()
    wrong[-256:] = 0
    wrong /= wrong.sum()
    assert chi2_pvalue(draws(lambda r: sample(wrong, r)), as_expected(probs)) < ALPHA


def test_a_flat_rows_nucleus_is_sampled_without_listing_it():
    # top 9: the nucleus is ~100k tokens; drawing from it tests each draw's membership (one
    # pass) instead of listing it (several)
    row = vocab_row(top=9.0)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    d = distribution(row, params)
    assert isinstance(d, Truncated)
    rng = np.random.default_rng(0)
    got = [d.sample(rng) for _ in range(200)]
    assert d._listed is None
    support = process(row, params) > 0
    assert support[got].all()


def test_the_membership_test_agrees_with_the_listed_nucleus():
    row = vocab_row(top=9.0)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    lazy, listed = distribution(row, params), distribution(row, params).listed()
    kept = np.flatnonzero(listed.w[: row.size])
    dropped = np.flatnonzero(listed.w[: row.size] == 0)
    # the tokens either side of the cut (where a wrong sum would show), and others
    near = np.concatenate([kept[np.argsort(row[kept])[:100]],
                           dropped[np.argsort(row[dropped])[-100:]],
                           np.random.default_rng(0).choice(row.size, 100, replace=False)])
    calls = [lazy._inside(int(y)) for y in near]
    decided = [(int(y), c) for y, c in zip(near, calls) if c is not None]
    assert len(decided) >= 0.9 * len(near)  # (undecided: within 1e-5 of the mass of the cut)
    assert all(c == (listed.w[y] > 0) for y, c in decided)


def _forced_flat(monkeypatch):
    # (3,000-token rows made to take the flat path: no candidates, no min-p shortcut)
    monkeypatch.setattr(sampling, "_MAX_CANDIDATES", 0)
    monkeypatch.setattr(sampling, "_NUCLEUS_GUESS", 1)


@pytest.mark.parametrize("case", ["tested", "undecided", "gives-up"])
def test_a_truncated_row_samples_its_nucleus(case, monkeypatch):
    # a 3,000-token row made to take the flat path; every draw decided by the membership
    # test, or none (each draw then lists the nucleus), or a low top_p with one try (most
    # draws sample the listed nucleus after a miss): all must follow the reference's nucleus.
    # Negative control: the whole row's distribution (5% of its mass outside the nucleus)
    # fails the same test (it draws tokens the nucleus does not have). 5,000 draws, not
    # 20,000: each draw lists the nucleus in two of the cases.
    _forced_flat(monkeypatch)
    top_p = 0.5 if case == "gives-up" else 0.95
    if case == "undecided":
        monkeypatch.setattr(sampling, "_LAZY_MARGIN", 2.0)
    if case == "gives-up":
        monkeypatch.setattr(Truncated, "TRIES", 1)
    row = vocab_row(n=3000, top=6.0)
    params = SamplingParams(temperature=1.0, top_p=top_p)
    expected = as_expected(process(row, params))

    def draw(rng):
        d = distribution(row, params)
        assert isinstance(d, Truncated)
        return d.sample(rng)

    # (a fresh distribution per draw: a listed one would sample the listing from then on)
    assert chi2_pvalue(draws(draw, n=N_DRAWS // 4), expected) > ALPHA
    full = distribution(row, params).full
    assert chi2_pvalue(draws(full.sample, n=N_DRAWS // 4), expected) < ALPHA


def test_truncated_probability_bounds_hold_the_listed_probability(monkeypatch):
    _forced_flat(monkeypatch)
    row = vocab_row(n=3000, top=6.0)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    listed = distribution(row, params).listed()
    lazy = distribution(row, params)
    rng = np.random.default_rng(0)
    ys = {int(y) for y in rng.choice(row.size, 300, replace=False)}
    ys |= {lazy.sample(rng) for _ in range(50)}  # (tokens known inside: bounds for free)
    widths = []
    for y in sorted(ys):
        lo, hi = lazy.prob_bounds(y)
        p = listed.prob(y)
        assert lo <= p <= hi
        if p > 0:
            widths.append(hi / lo)
    assert lazy._listed is None  # none of it listed the nucleus
    # a token of no weight (an impossible logit, or past the row's end) has none
    row[7] = -np.inf
    lazy = distribution(row, params)
    assert lazy.prob_bounds(7) == (0.0, 0.0) == lazy.prob_bounds(row.size + 3)
    assert lazy._listed is None
    # the bounds are top_p's ratio apart (plus the margins), no wider
    assert max(widths) <= 1 / 0.95 * (1 + 1e-4)


@pytest.mark.parametrize("seed", range(12))
def test_verify_decides_from_bounds_as_from_the_listed_values(seed, monkeypatch):
    # one round of 4 drafts from a perturbed row against the target's rows, with every
    # distribution a Truncated (lazy) or its listed Dense: same seed, same decisions (the
    # token that follows is drawn differently: by rejection from the lazy form)
    _forced_flat(monkeypatch)
    rng = np.random.default_rng(100 + seed)
    base = vocab_row(n=3000, top=6.0, seed=seed)
    target_rows = [base + rng.normal(0, 0.3, base.size).astype(np.float32) for _ in range(5)]
    draft_rows = [r + rng.normal(0, 0.5, base.size).astype(np.float32) for r in target_rows[:4]]
    params = SamplingParams(temperature=1.0, top_p=0.95)
    draw = np.random.default_rng(seed)
    q_lazy = [distribution(r, params) for r in draft_rows]
    tokens = [q.sample(draw) for q in q_lazy]
    lazy_p = [distribution(r, params) for r in target_rows]
    got = verify(tokens, q_lazy, lazy_p, np.random.default_rng(seed))
    want = verify(tokens, [distribution(r, params).listed() for r in draft_rows],
                  [distribution(r, params).listed() for r in target_rows],
                  np.random.default_rng(seed))
    assert (got.n_accepted, got.next_source) == (want.n_accepted, want.next_source)
    # (and the accepted positions' target rows decided without listing, as a rule)
    if got.n_accepted:
        assert any(p._listed is None for p in lazy_p[: got.n_accepted])


@pytest.mark.parametrize("case", ["dense-dense", "dense-onehot", "sparse-sparse",
                                  "sparse-onehot", "fallback"])
def test_sample_residual_follows_the_residual(case, monkeypatch):
    p_row = vocab_row(n=2000, seed=1, top=5.0)
    q_row = p_row + np.random.default_rng(2).normal(0, 1.0, p_row.size).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=30 if case.startswith("sparse") else 0)
    p, q = distribution(p_row, params), distribution(q_row, params)
    x = int(np.argmax(p.dense()))
    if case.endswith("onehot"):
        q = None
    if case == "fallback":  # no rejection-sampling tries: the dense residual straight away
        monkeypatch.setattr(rejection, "RESIDUAL_TRIES", 0)
    want = residual(p.dense(), None if q is None else q.dense(), x)
    got = draws(lambda r: sample_residual(p, q, x, r))
    assert chi2_pvalue(got, as_expected(want)) > ALPHA


def test_sample_residual_when_p_equals_q_falls_back_to_p():
    row = vocab_row(n=500, top=3.0)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=20)):
        p = distribution(row, params)
        y = sample_residual(p, distribution(row, params), 0, np.random.default_rng(0))
        assert p.prob(y) > 0


def test_verify_accepts_dists_and_dense_vectors_alike():
    # the same round, given as Dist objects and as the reference's dense vectors, consumes the
    # same uniforms for the acceptance tests and so accepts the same number of drafts
    rng_rows = np.random.default_rng(3)
    params = SamplingParams(temperature=1.0, top_k=8)
    rows = [rng_rows.normal(0, 1, 50).astype(np.float32) for _ in range(4)]
    p = [distribution(r, params) for r in rows]
    dense = [d.dense() for d in p]
    tokens = [int(np.argmax(d)) for d in dense[:3]]
    for seed in range(50):
        a = verify(tokens, [None] * 3, p, np.random.default_rng(seed))
        b = verify(tokens, [None] * 3, dense, np.random.default_rng(seed))
        assert a.n_accepted == b.n_accepted
    assert isinstance(Exact(dense[0]).sample(np.random.default_rng(0)), int)


# ggml's vectorised exp (edgespec._native.exp_kernel) against NumPy's and float64


def test_the_native_exp_kernel_is_found_here():
    """llama-cpp-python is installed with the tests: ggml's kernel must be found and used
    (a silent fall-back to NumPy would cost 2-4x per untruncated row)."""
    from edgespec import _native

    assert _native.library_path() is not None
    assert _native.exp_kernel() is not None


@pytest.mark.parametrize("path", ["compiled", "ggml"])
@pytest.mark.parametrize("size", [1, 7, 8, 9, 255, 4099, 151_936])
@pytest.mark.parametrize("shift", [0.0, 3.5, -2.0])
def test_a_whole_rows_exp_matches_float64(size, shift, path, monkeypatch):
    if path == "ggml":
        monkeypatch.setattr(sampling, "_ROWS", None)
    rng = np.random.default_rng(size)
    x = rng.normal(0, 8, size).astype(np.float32)
    x[:: 5] = -np.inf
    x[1:: 11] = -120.0  # underflows to 0 (or a subnormal) after the shift
    out = np.empty_like(x)
    total = sampling._dense_into(x, shift, 1.0, out)  # (at T 1: exp_shifted, or the compiled pass)
    # the shift is subtracted in float32 (as NumPy's fall-back does): exp's own error is
    # what is checked
    want = np.exp((x - np.float32(shift)).astype(np.float64))
    # the compiled pass's, ggml's and NumPy's float32 exp are all within 2e-7 relative of
    # float64 (measured
    # over [-120, 0] in steps of 6e-5); subnormals keep few digits: atol at their scale
    np.testing.assert_allclose(out, want, rtol=4e-7, atol=1e-44)
    assert total is not None and total == pytest.approx(want.sum(), rel=1e-6)
    np.exp(x - np.float32(shift), out=out)  # NumPy's, for the fall-back's accuracy
    np.testing.assert_allclose(out, want, rtol=4e-7, atol=1e-44)


def test_exp_shifted_in_place_and_the_numpy_fall_back(monkeypatch):
    x = np.linspace(-30, 5, 1001).astype(np.float32)
    fast = x.copy()
    sampling.exp_shifted(fast, 5.0, fast)  # in place
    monkeypatch.setattr(sampling, "exp_kernel", lambda: None)
    slow = np.empty_like(x)
    assert sampling.exp_shifted(x, 5.0, slow) is None  # NumPy gives no total
    np.testing.assert_allclose(fast, slow, rtol=4e-7)
    # a float64 or strided array never reaches the kernel (it reads float32 by address)
    monkeypatch.undo()
    out = np.empty(501, np.float32)
    assert sampling.exp_shifted(x[::2], 0.0, out) is None


@pytest.mark.parametrize("path", ["ggml", "numpy"])
@settings(max_examples=150, deadline=None)
@given(row=rows, params=params_st)
def test_distribution_without_the_compiled_passes_equals_the_dense_reference(path, row, params):
    """The fall-back paths keep the same distribution: NumPy's passes with ggml's exp, and
    NumPy alone (no ggml kernel either)."""
    if np.all(row == -np.inf):
        return
    truncated = (0 < params.top_k < row.size or params.top_p < 1 or params.min_p > 0
                 or params.greedy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling, "_ROWS", None)
        if path == "numpy":
            mp.setattr(sampling, "exp_kernel", lambda: None)
        assert_same(row, params, rtol=1e-9 if truncated else 1e-5)


def test_dense_with_a_known_total_makes_its_block_sums_only_to_sample(monkeypatch):
    row = vocab_row(4096, seed=3)
    monkeypatch.setattr(sampling, "_ROWS", None)  # (the compiled pass makes them with the total)
    d = distribution(row, SamplingParams(temperature=0.8))
    assert isinstance(d, Dense) and d._blocks is None
    ref = process(row, SamplingParams(temperature=0.8))
    assert d.prob(5) == pytest.approx(ref[5], rel=1e-5)
    assert d._blocks is None  # prob() alone: no block sums
    d.sample(np.random.default_rng(0))
    assert d._blocks is not None
    assert d.blocks.sum() == pytest.approx(d.total, rel=1e-6)


def test_the_compiled_pass_gives_a_dense_row_its_block_sums_with_its_weights():
    if sampling._ROWS is None:
        pytest.skip("the row passes are not compiled here")  # (test_the_row_passes_are_built_here fails)
    row = vocab_row(4096 + 77, seed=3)
    d = distribution(row, SamplingParams(temperature=0.8))
    assert isinstance(d, Dense) and d._blocks is not None
    # each block's float64 sum (dist.block_sums' float32 ones are within ~1e-7 of them)
    np.testing.assert_allclose(d.blocks, dist.block_sums(d.w), rtol=1e-6, atol=0)
    assert d.blocks.sum() == pytest.approx(d.total, rel=1e-12)


def test_no_native_exp_when_switched_off():
    import subprocess
    import sys

    code = "from edgespec import _native; print(_native.exp_kernel() is None)"
    env = {"EDGESPEC_NUMPY_EXP": "1", "PATH": "/usr/bin:/bin"}
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=root)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"


@pytest.mark.parametrize("path", ["compiled", "ggml", "numpy"])
@pytest.mark.parametrize("size", [5, 63, 64, 65, 130, 151_936 + 7])
def test_tied_logits_get_equal_weights_wherever_they_sit(size, path, monkeypatch):
    """ggml finishes a row's tail with scalar expf, which rounds differently from its SIMD
    loop: exp_shifted must give tied logits the same weight anywhere in the row, or a tie
    at a top-p cut would not go to the lowest id (found by the wide-row property test)."""
    if path != "compiled":
        monkeypatch.setattr(sampling, "_ROWS", None)
    if path == "numpy":
        monkeypatch.setattr(sampling, "exp_kernel", lambda: None)
    x = np.zeros(size, np.float32)
    x[::3] = -1.7
    out = np.empty_like(x)
    sampling._dense_into(x * np.float32(4.0), 4.0, 1.0, out)  # (exp_shifted, or the compiled pass)
    assert np.unique(out[x == 0]).size == 1 and np.unique(out[x != 0]).size == 1


def test_a_tie_at_the_top_p_cut_goes_to_the_lowest_ids_on_the_dense_path():
    row = np.array([0.0] * 9 + [1.0], np.float32)  # the case hypothesis found
    params = SamplingParams(temperature=0.25, top_p=0.9)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling, "_MAX_CANDIDATES", 0)
        mp.setattr(sampling, "_NUCLEUS_GUESS", 1)
        mp.setattr(sampling, "_SAMPLE", 16)
        mp.setattr(sampling, "_BRACKET", 1)
        got = distribution(row, params).dense()
    assert np.flatnonzero(got).tolist() == [0, 1, 2, 9]


def _count_dense_refuse_candidates(monkeypatch, why: str) -> list:
    """Patch the sampler so that each whole-row pass (``_dense``) appends to the list returned
    and a search for top-p's candidates fails the test with ``why``."""
    calls: list = []
    dense = sampling._dense
    monkeypatch.setattr(sampling, "_dense", lambda *a, **k: calls.append(1) or dense(*a, **k))

    def refuse(*args, **kwargs):
        raise AssertionError(why)

    monkeypatch.setattr(sampling, "_top_candidates", refuse)
    return calls


def test_a_row_whose_bulk_moves_the_cut_takes_its_nucleus_from_its_head(monkeypatch):
    # top 15: the nucleus is a few of the planted tokens, but the bulk's weight (~2% of the
    # row's) decides which: one exact total (a pass over the row) places the cut among the
    # head's tokens, with no candidates sought and nothing sorted beyond the head
    params = SamplingParams(temperature=0.8, top_p=0.95)
    row = vocab_row(top=15.0)
    calls = _count_dense_refuse_candidates(monkeypatch, "candidates sought past the head")
    got = distribution(row, params)
    assert isinstance(got, Sparse) and calls == [1]
    monkeypatch.undo()
    assert_same(row, params)


@pytest.mark.parametrize("wide, top_p, listed", [(200, 0.95, True), (200, 0.4, True),
                                                 (90, 0.95, True), (600, 0.95, False),
                                                 (0, 0.95, False), (0, 0.3, False)])
def test_a_wide_head_takes_one_exact_pass_and_no_candidate_search(wide, top_p, listed,
                                                                  monkeypatch):
    # more columns reach the head's weight (1e-4 of the top token's) than it lists: `wide`
    # tokens at ~1e-3 of the top one, in as many columns, hold a nucleus of some of them
    # over a light bulk (Sparse, listed from those columns, up to _WIDE_HEAD of them; past
    # that, kept as the flat row's); with none (wide=0), a flat row (top 9: the bulk holds
    # most of the mass), its nucleus dense
    params = SamplingParams(temperature=0.8, top_p=top_p)
    rng = np.random.default_rng(wide)
    if wide:
        row = rng.normal(-20.0, 2.0, 151_936).astype(np.float32)
        row[rng.choice(151_936 // 64, wide, replace=False) * 64 + 5] = (
            14.0 - 0.8 * 7.0 + rng.uniform(-0.5, 0.5, wide).astype(np.float32))
        row[1000] = 14.0
    else:
        row = vocab_row(top=9.0)
    maxima = sampling._Maxima.of(row)
    assert sampling._head(maxima, maxima.top, 0.8, loose=True) is None  # (a wide head)
    calls = _count_dense_refuse_candidates(monkeypatch, "candidates sought for a wide head")
    got = distribution(row, params)
    assert calls == [1]
    assert isinstance(got, Sparse) == listed, type(got)
    monkeypatch.undo()
    assert_same(row, params, rtol=1e-9 if listed else 1e-5)


@pytest.mark.skipif(sampling._ROWS is None, reason="the row passes are not compiled here")
@pytest.mark.parametrize("top", [9.0, 14.0, 20.0])
@pytest.mark.parametrize("mode", ["top_k40", "all"])
def test_top_k_takes_its_candidates_from_one_compiled_read(top, mode, monkeypatch):
    # the max and every logit from a hair below the 40th largest in one pass: no column
    # maxima, and the same distribution as the reference
    params = VOCAB_MODES[mode]
    row = vocab_row(top=top)
    row[[3, 90_000]] = np.sort(row)[-40]  # ties with the 40th largest

    def refuse(*args, **kwargs):
        raise AssertionError("the column maxima were made")

    monkeypatch.setattr(sampling._Maxima, "of", refuse)
    got = distribution(row, params)
    assert isinstance(got, Sparse)
    monkeypatch.undo()
    assert_same(row, params)
