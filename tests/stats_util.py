"""Goodness-of-fit helpers shared by the statistical tests.

Every statistical test here uses a fixed seed, so it is deterministic; the significance level
says how unlikely a *correct* sampler is to fail with an arbitrary seed. ``ALPHA = 1e-4`` keeps
that chance negligible across the whole suite (a few dozen tests), while each test's sample size
is chosen so that the known-wrong samplers in the negative controls fail it by a wide margin.
"""

from __future__ import annotations

from typing import Hashable, Mapping

import numpy as np
from scipy import stats

ALPHA = 1e-4


def chi2_pvalue(counts: Mapping[Hashable, int], expected: Mapping[Hashable, float]) -> float:
    """Pearson chi-square p-value of observed counts against expected probabilities.

    Outcomes whose expected count is below 5 (the usual validity rule for the chi-square
    approximation) are pooled into one bin; an observed outcome with expected probability 0
    gives p = 0 outright (the sampler produced something impossible).
    """
    n = sum(counts.values())
    for outcome, c in counts.items():
        if c and expected.get(outcome, 0.0) <= 0.0:
            return 0.0
    obs, exp = [], []
    pooled_obs, pooled_exp = 0, 0.0
    for outcome, prob in expected.items():
        e = prob * n
        if e >= 5:
            obs.append(counts.get(outcome, 0))
            exp.append(e)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += e
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    if len(obs) < 2:
        return 1.0
    exp_arr = np.asarray(exp)
    exp_arr *= sum(obs) / exp_arr.sum()  # absorb float rounding in the expected total
    return float(stats.chisquare(obs, exp_arr).pvalue)
