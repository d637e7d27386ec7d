"""The exact speculative-sampling test (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2).

Given k drafted tokens ``x_1..x_k``, the draft distributions ``q_i`` they were sampled from, and
the target distributions ``p_1..p_{k+1}`` (all already processed by :func:`edgespec.sampling.process`
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
    q_draft: Sequence[np.ndarray | None],
    p_target: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Run the exact rejection test over one round of drafts.

    ``p_target`` holds k + 1 rows (an array of shape ``(k + 1, V)`` or any sequence of rows,
    e.g. one that processes rows lazily): row i is the target distribution at draft position i,
    the last row the distribution after all k drafts. Rows after a rejection are never read. ``q_draft[i]`` is the (processed) draft
    distribution ``x_i`` was sampled from, or ``None`` for a one-hot (deterministic) draft.
    """
    k = len(draft_tokens)
    if len(q_draft) != k or len(p_target) != k + 1:
        raise ValueError(
            f"verify: {k} drafts, {len(q_draft)} draft distributions, "
            f"{len(p_target)} target rows (need k, k, k+1)"
        )
    for i, (x, q) in enumerate(zip(draft_tokens, q_draft)):
        p = p_target[i]
        p_x = p[x]
        q_x = 1.0 if q is None else q[x]
        # accept with probability min(1, p/q), i.e. u * q < p (no division; q_x > 0 as x ~ q)
        if rng.random() * q_x < p_x:
            continue
        return Verdict(i, sample(residual(p, q, x), rng), Source.CORRECTED)
    source = Source.BONUS if k else Source.TARGET
    return Verdict(k, sample(p_target[k], rng), source)


def residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """``norm(max(0, p - q))``; for a one-hot draft of ``x``, ``p`` without ``x``.

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
