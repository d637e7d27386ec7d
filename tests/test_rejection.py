"""The exact rejection test: emitted tokens follow the target distribution for every setting.

Sample sizes: each goodness-of-fit test draws N rounds over a handful of outcomes, so the
chi-square test has ample power; every test is paired with a negative control (a known-wrong
variant of the algorithm) that must fail the *same* threshold at the *same* N, which shows the
threshold is tight enough to catch the bugs that matter.
"""

from __future__ import annotations

import zlib
from collections import Counter
from itertools import product

import numpy as np
import pytest

from edgespec.core import rejection
from edgespec.core.rejection import Source, residual, verify
from edgespec.core.sampling import SamplingParams, make_rng, process, sample

from .stats_util import ALPHA, chi2_pvalue

V = 6
MODES = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-0.7": SamplingParams(temperature=0.7),
    "top-k-3": SamplingParams(temperature=1.0, top_k=3),
    "top-p-0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "min-p-0.1": SamplingParams(temperature=1.2, min_p=0.1),
    "all-filters": SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05),
}


def random_logits(rng: np.random.Generator, n: int = V) -> np.ndarray:
    logits = rng.normal(scale=2.0, size=n)
    logits[rng.integers(n)] = -np.inf  # a token the model rules out
    return logits


def first_tokens(p_logits, q_logits, params, n_rounds, seed, k=1):
    """Run n_rounds single-context rounds; return the first emitted token of each."""
    p = process(p_logits, params)
    q = process(q_logits, params)
    rng = make_rng(seed)
    out = []
    for _ in range(n_rounds):
        drafts = [sample(q, rng) for _ in range(k)]
        verdict = verify(drafts, [q] * k, np.stack([p] * (k + 1)), rng)
        out.append(drafts[0] if verdict.n_accepted else verdict.next_token)
    return p, out


@pytest.mark.parametrize("mode", MODES)
def test_first_token_follows_target(mode):
    rng = np.random.default_rng(zlib.crc32(mode.encode()))
    p_logits, q_logits = random_logits(rng), random_logits(rng)
    p, out = first_tokens(p_logits, q_logits, MODES[mode], n_rounds=20_000, seed=11)
    assert chi2_pvalue(Counter(out), dict(enumerate(p))) > ALPHA


def test_negative_control_residual_p_instead_of_p_minus_q(monkeypatch):
    # Resampling from p (not norm(max(0, p - q))) after a rejection over-weights the draft's
    # favourites; the same N and threshold must catch it.
    rng = np.random.default_rng(3)
    p_logits, q_logits = random_logits(rng), random_logits(rng)
    monkeypatch.setattr(rejection, "residual", lambda p, q, x: p)
    p, out = first_tokens(p_logits, q_logits, MODES["temperature-1"], n_rounds=20_000, seed=11)
    assert chi2_pvalue(Counter(out), dict(enumerate(p))) < ALPHA


def test_one_hot_draft_follows_target():
    # Prompt lookup proposes a fixed token with q = one_hot(x): accept w.p. p(x), else p minus x.
    rng = np.random.default_rng(5)
    p = process(random_logits(rng), SamplingParams(temperature=1.0))
    x = int(np.argsort(p)[-2])  # a plausible but not the most likely token
    rng = make_rng(12)
    out = []
    for _ in range(20_000):
        v = verify([x], [None], np.stack([p, p]), rng)
        out.append(x if v.n_accepted else v.next_token)
    assert chi2_pvalue(Counter(out), dict(enumerate(p))) > ALPHA


def test_one_hot_draft_of_impossible_token_is_always_rejected():
    p = np.array([0.5, 0.5, 0.0])
    rng = make_rng(0)
    verdicts = [verify([2], [None], np.stack([p, p]), rng) for _ in range(200)]
    assert all(v.n_accepted == 0 and v.next_token in (0, 1) for v in verdicts)


def markov(rng: np.random.Generator, n: int, params: SamplingParams) -> np.ndarray:
    """A toy language model: row ``prev`` is the processed next-token distribution."""
    return np.stack([process(random_logits(rng, n), params) for _ in range(n + 1)])


def speculative_run(P, Q, n_tokens, k, rng, one_hot=False):
    """Generate n_tokens from Markov target P with drafts from Q, through verify()."""
    bos = P.shape[0] - 1
    out: list[int] = []
    while len(out) < n_tokens:
        prev = out[-1] if out else bos
        drafts, qs = [], []
        for _ in range(k):
            q = Q[prev]
            x = int(np.argmax(q)) if one_hot else sample(q, rng)
            drafts.append(x)
            qs.append(None if one_hot else q)
            prev = x
        ctx = [out[-1] if out else bos] + drafts
        verdict = verify(drafts, qs, np.stack([P[c] for c in ctx]), rng)
        out += drafts[: verdict.n_accepted] + [verdict.next_token]
    return tuple(out[:n_tokens])


def joint_probs(P, n_tokens):
    bos = P.shape[0] - 1
    n = P.shape[1]
    probs = {}
    for seq in product(range(n), repeat=n_tokens):
        pr, prev = 1.0, bos
        for t in seq:
            pr *= P[prev, t]
            prev = t
        probs[seq] = pr
    return probs


@pytest.mark.parametrize("mode", ["temperature-1", "top-p-0.8", "all-filters"])
@pytest.mark.parametrize("one_hot", [False, True], ids=["model-draft", "one-hot-draft"])
def test_joint_of_three_tokens_over_multi_token_rounds(mode, one_hot):
    # 3 tokens over a 4-token vocabulary: 64 outcomes, N = 30,000 sequences. k = 3 drafts per
    # round, so accepted runs, corrections at every position and bonus tokens all occur.
    rng = np.random.default_rng(21)
    P, Q = markov(rng, 4, MODES[mode]), markov(rng, 4, MODES[mode])
    run_rng = make_rng(22)
    seqs = [speculative_run(P, Q, 3, 3, run_rng, one_hot) for _ in range(30_000)]
    assert chi2_pvalue(Counter(seqs), joint_probs(P, 3)) > ALPHA


def test_negative_control_joint_accept_always():
    # Accepting every draft ("trust the drafter") samples from Q, not P.
    rng = np.random.default_rng(21)
    P, Q = markov(rng, 4, MODES["temperature-1"]), markov(rng, 4, MODES["temperature-1"])
    run_rng = make_rng(22)
    seqs = [speculative_run(Q, Q, 3, 3, run_rng) for _ in range(30_000)]
    assert chi2_pvalue(Counter(seqs), joint_probs(P, 3)) < ALPHA


def test_all_paths_are_hit():
    rng = np.random.default_rng(8)
    P, Q = markov(rng, 4, MODES["temperature-1"]), markov(rng, 4, MODES["temperature-1"])
    run_rng = make_rng(9)
    seen: Counter = Counter()
    for _ in range(2000):
        drafts = [sample(Q[4], run_rng)]
        drafts.append(sample(Q[drafts[0]], run_rng))
        ctx = [4] + drafts
        v = verify(drafts, [Q[4], Q[drafts[0]]], np.stack([P[c] for c in ctx]), run_rng)
        seen[(v.next_source, v.n_accepted)] += 1
    assert seen[(Source.CORRECTED, 0)] and seen[(Source.CORRECTED, 1)] and seen[(Source.BONUS, 2)]


def test_greedy_accepts_exactly_the_argmax_prefix():
    greedy = SamplingParams(temperature=0)
    rows = [np.array([0.1, 2.0, 0.3]), np.array([1.5, 0.2, 0.1]), np.array([0.0, 0.0, 4.0])]
    p = np.stack([process(r, greedy) for r in rows])  # argmaxes: 1, 0, 2
    rng = make_rng(0)
    q1 = process(np.array([0.0, 1.0, 0.0]), greedy)
    assert verify([1, 0], [q1, None], p, rng) == rejection.Verdict(2, 2, Source.BONUS)
    assert verify([1, 2], [q1, None], p, rng) == rejection.Verdict(1, 0, Source.CORRECTED)
    assert verify([0, 0], [None, None], p, rng) == rejection.Verdict(0, 1, Source.CORRECTED)


def test_no_drafts_is_plain_sampling():
    p = np.array([[0.0, 1.0, 0.0]])
    assert verify([], [], p, make_rng(0)) == rejection.Verdict(0, 1, Source.TARGET)


def test_residual_without_mass_falls_back_to_target():
    p = np.array([0.2, 0.8])
    np.testing.assert_array_equal(residual(p, p.copy(), 0), p)
    np.testing.assert_allclose(residual(p, np.array([0.5, 0.5]), 0), [0.0, 1.0])
    np.testing.assert_allclose(residual(p, None, 1), [1.0, 0.0])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="k\\+1"):
        verify([1], [None], np.ones((1, 3)) / 3, make_rng(0))


def test_greedy_verdict_from_picks_equals_the_full_test():
    # verify_greedy sees only the target's picks; verify sees the one-hot distributions (and
    # one-hot drafts, as a greedy draft model's or lookup's). Same verdict on every case of
    # k <= 3 drafts over 3 tokens, with every pick pattern.
    greedy = SamplingParams(temperature=0)
    for k in range(4):
        for drafts in product(range(3), repeat=k):
            for picks in product(range(3), repeat=k + 1):
                p = [process(np.eye(3)[t] * 5.0, greedy) for t in picks]
                q = [None if i % 2 else process(np.eye(3)[x] * 5.0, greedy)
                     for i, x in enumerate(drafts)]
                want = verify(list(drafts), q, p, make_rng(0))
                assert rejection.verify_greedy(list(drafts), np.array(picks, np.int32)) == want


def test_greedy_verdict_needs_k_plus_one_picks():
    with pytest.raises(ValueError, match="k\\+1"):
        rejection.verify_greedy([1, 2], [1, 2])


def test_the_residuals_draws_are_kept_from_bounds_as_from_values():
    # A flat top-p row (an unlisted nucleus, bounds on each p(y)) against draft
    # probabilities below, near and above p(y): every keep-or-not is the exact form's
    # (1 - q/p > 0, then one uniform below it), with the same uniforms drawn, and the
    # nucleus is listed only where the bounds cannot decide.
    from edgespec.core.dist import Truncated
    from edgespec.core.sampling import distribution

    from .test_distribution import vocab_row

    row = vocab_row(top=9.0)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    listed = distribution(row, params).listed()
    ys = np.random.default_rng(1).choice(np.flatnonzero(listed.w[: row.size]), 20, replace=False)
    for y in map(int, ys):
        p = listed.prob(y)
        for ratio in (0.0, 0.3, 0.9, 0.999, 1.0, 1.001, 1.2, 3.0):
            for seed in range(6):
                lazy = distribution(row, params)
                assert isinstance(lazy, Truncated)
                got_rng, want_rng = make_rng(seed), make_rng(seed)
                got = rejection._keeps(lazy, ratio * p, y, got_rng)
                keep = 1.0 - ratio * p / p
                want = keep > 0.0 and want_rng.random() < keep
                assert got == want, (y, ratio, seed)
                assert got_rng.random() == want_rng.random()  # as many uniforms drawn
                if ratio in (0.0, 3.0):
                    assert lazy._listed is None  # decided without listing the nucleus
