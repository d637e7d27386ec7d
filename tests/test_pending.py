"""Target rows left pending (``pending_distribution``): bounds on each probability from the
row's column maxima, resolved to exactly what ``distribution`` gives only when a value or a
draw is needed. The rejection test must reach the same verdicts, token for token, with the
same seed, as with the resolved rows."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core import sampling
from edgespec.core.dist import Dense, Pending
from edgespec.core.rejection import verify
from edgespec.core.sampling import SamplingParams, distribution, pending_distribution

from .test_distribution import vocab_row

T08 = SamplingParams(temperature=0.8)


def confident_row(n: int = 151_936, seed: int = 0, top: float = 22.0) -> np.ndarray:
    """A real model's confident row: the bulk far below a few peaks (a code model's rows at
    T 0.8 put a median 99.5% of their mass on the top token)."""
    return vocab_row(n, seed, top)


def probe_tokens(row: np.ndarray, seed: int = 0) -> list[int]:
    """The heaviest tokens, random ones, ones with the lowest logits, and past the row."""
    rng = np.random.default_rng(seed)
    order = np.argsort(row)
    return sorted({*map(int, order[-40:]), *map(int, order[:20]),
                   *map(int, rng.choice(row.size, 200, replace=False)), row.size, row.size + 5})


@pytest.mark.parametrize("t", [0.25, 0.8, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(3))
def test_bounds_hold_the_resolved_probability(t, seed):
    row = confident_row(seed=seed, top=max(22.0, 28.0 * t))
    row[[5, 77]] = -np.inf  # impossible tokens
    row[9] = row.max() - 90 * t  # a weight float32 holds only as a subnormal
    params = SamplingParams(temperature=t)
    lazy = pending_distribution(row, params)
    assert isinstance(lazy, Pending)
    want = distribution(row, params)
    widths = []
    for y in [*probe_tokens(row, seed), 5, 77, 9]:
        lo, hi = lazy.prob_bounds(y)
        p = want.prob(y) if y < row.size else 0.0
        assert lo <= p <= hi, (y, lo, p, hi)
        if p > 1e-6:
            widths.append(hi / lo)
    assert lazy._dist is None  # bounds only: nothing computed over the whole row
    # tight enough to decide nearly every test: the ratio the row was admitted with, at most
    assert max(widths) <= sampling._HEAD_RATIO * (1 + 1e-3)


def test_resolved_is_what_distribution_gives():
    row = confident_row(seed=4)
    lazy = pending_distribution(row, T08)
    want = distribution(row, T08)
    got = lazy.resolved()
    assert isinstance(got, Dense) and isinstance(want, Dense)
    np.testing.assert_array_equal(got.w, want.w)
    assert got.total == want.total
    assert lazy.prob(3) == want.prob(3)
    assert lazy.prob_bounds(3) == (want.prob(3), want.prob(3))  # (exact once resolved)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    assert [lazy.sample(rng_a) for _ in range(50)] == [want.sample(rng_b) for _ in range(50)]


@pytest.mark.parametrize("top", [9.0, 14.0])
def test_a_flat_row_is_computed_at_once(top):
    # most of the weight in a bulk the column maxima bound only 64-fold: no use waiting
    row = vocab_row(top=top)
    got = pending_distribution(row, T08)
    assert isinstance(got, Dense)
    want = distribution(row, T08)
    np.testing.assert_array_equal(got.w, want.w)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=0.8, top_k=40),
                                    SamplingParams(temperature=0.8, top_p=0.9),
                                    SamplingParams(temperature=0.8, min_p=0.05)])
def test_other_modes_are_distribution(params):
    row = confident_row()
    got, want = pending_distribution(row, params), distribution(row, params)
    assert type(got) is type(want)
    np.testing.assert_array_equal(got.dense(), want.dense())


def test_short_and_bad_rows_go_to_distribution():
    short = np.array([0.0, 3.0, 1.0], np.float32)
    assert not isinstance(pending_distribution(short, T08), Pending)
    bad = confident_row()
    bad[10] = np.nan
    with pytest.raises(Exception) as err_lazy:
        pending_distribution(bad, T08)
    with pytest.raises(Exception) as err_ref:
        distribution(bad, T08)
    assert type(err_lazy.value) is type(err_ref.value)


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("drafts", ["one-hot", "sampled"])
def test_verify_reaches_the_same_verdict_from_bounds(seed, drafts):
    # one round of 6 drafts against 7 target rows (confident ones, and a flat one now and
    # then), given pending and resolved: same seed, same verdict and the same next token
    rng = np.random.default_rng(100 + seed)
    target_rows = [confident_row(seed=seed * 7 + i, top=float(rng.uniform(12, 26)))
                   for i in range(7)]
    draw = np.random.default_rng(seed)
    if drafts == "one-hot":
        q = [None] * 6
        # mostly the target's likeliest token, sometimes another (rejections happen)
        tokens = [int(np.argmax(r)) if draw.random() < 0.8 else int(draw.integers(r.size))
                  for r in target_rows[:6]]
    else:
        q = [distribution(r + draw.normal(0, 0.5, r.size).astype(np.float32), T08)
             for r in target_rows[:6]]
        tokens = [d.sample(draw) for d in q]
    lazy = [pending_distribution(r, T08) for r in target_rows]
    got = verify(tokens, q, lazy, np.random.default_rng(seed))
    want = verify(tokens, q, [distribution(r, T08) for r in target_rows],
                  np.random.default_rng(seed))
    assert got == want
    # the accepted rows that were pending were decided from bounds, as a rule
    pending = [d for d in lazy[: got.n_accepted] if isinstance(d, Pending)]
    assert sum(d._dist is None for d in pending) >= len(pending) - 1
