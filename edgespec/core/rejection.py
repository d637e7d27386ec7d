"""The exact speculative-sampling test (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2).

Given k drafted tokens ``x_1..x_k``, the draft distributions ``q_i`` they were sampled from, and
the target distributions ``p_1..p_{k+1}`` (all already processed by :func:`edgespec.core.sampling.distribution`
with the same settings), accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))`` from left
to right. At the first rejection, sample the replacement from the residual
``norm(max(0, p_i - q_i))``; if all k pass, sample a bonus token from ``p_{k+1}``. The emitted tokens
are distributed exactly as target-only sampling (Chen et al., Theorem 1).

A deterministic drafter (prompt lookup) proposes with ``q = one_hot(x)``: it is accepted with
probability ``p(x)`` and the residual is ``p`` with ``x`` removed. Such a position passes
``None`` as its ``q``.

Pure NumPy; imports nothing from llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

import numpy as np

from .dist import Dist, Exact, Sparse, as_dist
from .sampling import sample


class Source(str, Enum):
    """Where an emitted token came from."""

    DRAFT = "draft"  #: a drafted token the target accepted
    CORRECTED = "corrected"  #: sampled by the target from the residual after a rejection
    BONUS = "bonus"  #: sampled by the target after every draft token was accepted
    TARGET = "target"  #: sampled by the target with nothing drafted (plain decoding)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verification: how many drafts were kept and the token that follows."""

    n_accepted: int
    next_token: int
    next_source: Source


def verify(
    draft_tokens: Sequence[int],
    q_draft: Sequence[Dist | np.ndarray | None],
    p_target: Sequence[Dist | np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Run the exact rejection test over one round of drafts.

    ``p_target`` holds k + 1 distributions (:mod:`edgespec.core.dist` objects or dense
    probability vectors; any sequence, e.g. one that processes rows lazily): row i is the
    target distribution at draft position i, the last one the distribution after all k drafts.
    Rows after a rejection are never read. ``q_draft[i]`` is the (processed) draft distribution
    ``x_i`` was sampled from, or ``None`` for a one-hot (deterministic) draft. A distribution
    with ``prob_bounds`` (a flat top-p row's unlisted nucleus) is first asked for bounds on
    ``p(x)``: the test only needs the values when the uniform falls between what they allow.
    """
    k = len(draft_tokens)
    if len(q_draft) != k or len(p_target) != k + 1:
        raise ValueError(
            f"verify: {k} drafts, {len(q_draft)} draft distributions, "
            f"{len(p_target)} target rows (need k, k, k+1)"
        )
    for i, (x, q) in enumerate(zip(draft_tokens, q_draft)):
        p = as_dist(p_target[i])
        q = None if q is None else as_dist(q)
        # accept with probability min(1, p/q), i.e. u * q < p (no division; q_x > 0 as x ~ q),
        # from bounds on p_x and q_x where they decide it (a flat top-p row then never lists
        # its nucleus), else from the values
        p_lo, p_hi = _prob_bounds(p, x)
        q_lo, q_hi = (1.0, 1.0) if q is None else _prob_bounds(q, x)
        u = rng.random()
        if u * q_hi < p_lo:
            continue
        if u * q_lo < p_hi and u * (1.0 if q is None else q.prob(x)) < p.prob(x):
            continue
        return Verdict(i, sample_residual(p, q, x, rng), Source.CORRECTED)
    source = Source.BONUS if k else Source.TARGET
    return Verdict(k, as_dist(p_target[k]).sample(rng), source)


def _prob_bounds(d: Dist, x: int) -> tuple[float, float]:
    """Bounds on ``d.prob(x)``: cheap ones where the distribution has them
    (:meth:`edgespec.core.dist.Truncated.prob_bounds`), else the value twice."""
    bounds = getattr(d, "prob_bounds", None)
    if bounds is not None:
        return bounds(x)
    p = d.prob(x)
    return p, p


def verify_greedy(draft_tokens: Sequence[int], target_picks: Sequence[int]) -> Verdict:
    """:func:`verify` for greedy decoding, from the target's picks alone.

    Greedy processing makes every target distribution one-hot on its pick (``target_picks``:
    k + 1 token ids) and every draft one-hot, so a draft is accepted exactly when it equals
    the pick, and the first mismatch is replaced by the pick (the residual of two different
    one-hots is the target's). Same verdicts as :func:`verify`, without any distribution.
    """
    k = len(draft_tokens)
    if len(target_picks) != k + 1:
        raise ValueError(f"verify_greedy: {k} drafts, {len(target_picks)} target picks (need k+1)")
    picks = target_picks.tolist() if isinstance(target_picks, np.ndarray) else target_picks
    for i, x in enumerate(draft_tokens):
        if x != picks[i]:
            return Verdict(i, int(picks[i]), Source.CORRECTED)
    return Verdict(k, int(picks[k]), Source.BONUS if k else Source.TARGET)


#: Tries of the residual's rejection sampler before it computes the residual densely.
RESIDUAL_TRIES = 32


def sample_residual(p: Dist, q: Dist | None, x: int, rng: np.random.Generator) -> int:
    """Draw from ``norm(max(0, p - q))`` (for a one-hot draft of ``x``: ``p`` without ``x``).

    Small supports (greedy, top-k, top-p, min-p) get the residual computed on the union of the
    two supports. A dense ``p`` is sampled by rejection: draw ``y ~ p`` and keep it with
    probability ``max(0, 1 - q(y) / p(y))``; each try succeeds with probability equal to the
    residual's mass, and after :data:`RESIDUAL_TRIES` failures the residual is computed densely.
    Either way the result is distributed exactly as the residual: every try, and the fallback,
    yields ``y`` with the residual's conditional law.
    """
    if isinstance(p, Exact) and (q is None or isinstance(q, Exact)):
        return sample(residual(p.probs, None if q is None else q.probs, x), rng)
    if hasattr(p, "support") and (q is None or hasattr(q, "support")):
        pids, pv = p.support()
        ids = pids
        if q is None:
            r = np.where(ids == x, 0.0, pv)
        else:
            qids, qv = q.support()
            ids = np.union1d(ids, qids)
            r = np.maximum(_on(ids, pids, pv) - _on(ids, qids, qv), 0.0)
        total = r.sum()
        if total <= 0.0:  # p == q up to rounding: the rejection had probability ~0
            return p.sample(rng)
        nz = r > 0.0
        return Sparse(ids[nz], r[nz] / total, p.n).sample(rng)
    for _ in range(RESIDUAL_TRIES):
        y = p.sample(rng)
        if q is None:
            if y != x:
                return y
            continue
        if _keeps(p, q.prob(y), y, rng):
            return y
    return sample(residual(p.dense(), None if q is None else q.dense(), x), rng)


def _keeps(p: Dist, qy: float, y: int, rng: np.random.Generator) -> bool:
    """Whether the residual's rejection sampler keeps its draw ``y ~ p``: with probability
    ``1 - q(y) / p(y)`` where that is positive (one uniform drawn then), from bounds on
    ``p(y)`` where they decide it: a flat top-p row is then never listed for its ``p(y)``,
    which a draw outside the draft's few tokens (``q(y) = 0``: kept) does not even bound.
    The same uniforms and the same answers as with ``p(y)`` itself (rounded division and
    subtraction are monotone, so the bounds' keep probabilities enclose the value's)."""
    if qy == 0.0:
        return rng.random() < 1.0  # (always: drawn all the same, as the exact form draws it)
    lo, hi = _prob_bounds(p, y)
    if qy >= hi:  # (hi >= p(y) > 0: nothing to keep, and no uniform drawn)
        return False
    if qy < lo:  # something to keep
        u = rng.random()
        if u < 1.0 - qy / lo:
            return True
        if u >= 1.0 - qy / hi:
            return False
        return u < 1.0 - qy / p.prob(y)
    keep = 1.0 - qy / p.prob(y)
    return keep > 0.0 and rng.random() < keep


def _on(ids: np.ndarray, sup: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Probabilities of ``ids`` (ascending) under a distribution given on ``sup`` (ascending)."""
    out = np.zeros(ids.size)
    out[np.searchsorted(ids, sup)] = probs
    return out


def residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """``norm(max(0, p - q))`` on dense vectors; for a one-hot draft of ``x``, ``p`` without
    ``x``. The reference form (and the fallback of :func:`sample_residual`).

    If the residual has no mass (``p == q`` up to rounding, so a rejection had probability ~0),
    fall back to ``p``: any choice is then exact to within that rounding.
    """
    if q is None:
        r = p.copy()
        r[x] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    if total <= 0.0:
        return p
    return r / total
