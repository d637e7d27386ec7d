"""Processed distributions: each sampling setting on hand-built distributions."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams, make_rng, process, sample
from edgespec.errors import ConfigError

from .stats_util import ALPHA, chi2_pvalue

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))


def test_temperature_one_is_softmax():
    probs = process(LOGITS, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(probs, [0.05, 0.4, 0.1, 0.3, 0.15], rtol=1e-12)


def test_temperature_sharpens_and_flattens():
    cold = process(LOGITS, SamplingParams(temperature=0.5))
    hot = process(LOGITS, SamplingParams(temperature=2.0))
    base = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    np.testing.assert_allclose(cold, base**2 / (base**2).sum(), rtol=1e-12)
    np.testing.assert_allclose(hot, np.sqrt(base) / np.sqrt(base).sum(), rtol=1e-12)


def test_greedy_is_one_hot_argmax_with_lowest_id_on_ties():
    probs = process(np.array([1.0, 3.0, 3.0, -2.0]), SamplingParams(temperature=0))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_k_keeps_k_most_likely():
    probs = process(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(probs, [0, 0.4 / 0.7, 0, 0.3 / 0.7, 0], rtol=1e-12)


def test_top_p_keeps_token_that_crosses_threshold():
    # sorted: 0.4, 0.3, 0.15, 0.1, 0.05 -> cumulative 0.4, 0.7, 0.85: top_p=0.75 keeps 3 tokens
    probs = process(LOGITS, SamplingParams(temperature=1.0, top_p=0.75))
    np.testing.assert_allclose(probs, [0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85], rtol=1e-12)


def test_top_p_tiny_keeps_the_top_token():
    probs = process(LOGITS, SamplingParams(temperature=1.0, top_p=1e-9))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_top_p_beyond_candidate_window_matches_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=0.01, size=5000)  # nearly flat: the nucleus spans >1024 tokens
    probs = process(logits, SamplingParams(temperature=1.0, top_p=0.9))
    full = np.exp(logits - logits.max())
    full /= full.sum()
    order = np.argsort(-full, kind="stable")
    keep = order[(np.cumsum(full[order]) - full[order]) < 0.9]
    assert (probs > 0).sum() == keep.size > 1024
    assert set(np.flatnonzero(probs)) == set(keep.tolist())


def test_min_p_drops_tokens_below_fraction_of_max():
    probs = process(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))  # threshold 0.12
    np.testing.assert_allclose(probs, [0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85], rtol=1e-12)


def test_filters_compose_in_documented_order():
    # temperature 0.5 first (squares the base probs), then top-k 3, then top-p 0.9:
    # after top-k the kept mass is 0.587, 0.330, 0.083; the mass before the third is 0.917 >= 0.9,
    # so top-p drops it. (Applying top-p before the temperature would keep it.)
    probs = process(LOGITS, SamplingParams(temperature=0.5, top_k=3, top_p=0.9))
    sq = np.array([0.05, 0.4, 0.1, 0.3, 0.15]) ** 2
    expected = np.where(np.isin(np.arange(5), [1, 3]), sq, 0)
    np.testing.assert_allclose(probs, expected / expected.sum(), rtol=1e-12)


def test_minus_inf_logits_get_zero_probability():
    probs = process(np.array([-np.inf, 0.0, -np.inf, 1.0]), SamplingParams(temperature=1.0))
    assert probs[0] == 0 and probs[2] == 0
    assert math.isclose(probs.sum(), 1.0)


@pytest.mark.parametrize(
    "logits, message",
    [(np.array([0.0, np.nan]), "NaN"), (np.array([-np.inf, -np.inf]), "-inf")],
)
def test_unusable_logits_raise(logits, message):
    with pytest.raises(ValueError, match=message):
        process(logits, SamplingParams(temperature=1.0))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.2}, "min_p"),
        ({"seed": -3}, "seed"),
    ],
)
def test_bad_settings_are_rejected_with_the_valid_range(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SamplingParams(**kwargs)


def test_sample_matches_distribution():
    # N = 20,000 draws over 5 outcomes: a correct sampler fails with probability ALPHA; the
    # negative control (drawing from the unprocessed uniform) fails by a huge margin.
    probs = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    rng = make_rng(1)
    draws = [sample(probs, rng) for _ in range(20_000)]
    assert chi2_pvalue(Counter(draws), dict(enumerate(probs))) > ALPHA
    uniform = [int(rng.integers(5)) for _ in range(20_000)]
    assert chi2_pvalue(Counter(uniform), dict(enumerate(probs))) < ALPHA


def test_sample_never_returns_zero_probability_token():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    rng = make_rng(2)
    assert {sample(probs, rng) for _ in range(2000)} == {1, 3}


def test_seeded_rng_is_reproducible():
    probs = np.full(50, 1 / 50)
    a = [sample(probs, make_rng(7)) for _ in range(3)]
    b = [sample(probs, make_rng(7)) for _ in range(3)]
    assert a == b
