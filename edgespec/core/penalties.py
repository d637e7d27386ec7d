"""Per-position shaping of a row of logits: logit bias and llama.cpp's penalties.

A position's shaped row depends on the tokens before it, drafts included, so the loop shapes
each scored row against the context that row follows (the committed text plus the drafts
before it); what is exact for the shaped distribution stays exact (the target's
distribution is still a function of the prefix alone). Order and meaning as llama.cpp's
sampler chain: the bias is added first, then for each token counted ``c`` times among the
last ``penalty_last_n`` tokens of the context, a positive logit is divided by
``repeat_penalty`` and a non-positive one multiplied, and ``c * frequency_penalty +
presence_penalty`` is subtracted.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import SamplingParams


def window(history: Sequence[int], params: SamplingParams) -> Sequence[int]:
    """The tokens the penalties count: the last ``penalty_last_n`` of ``history`` (-1: all)."""
    n = params.penalty_last_n
    if n == 0:
        return ()
    return history if n < 0 or n >= len(history) else history[len(history) - n:]


def shape(row: np.ndarray, params: SamplingParams, history: Sequence[int]) -> np.ndarray:
    """``row`` shaped for the position after ``history`` (a new float32 array; ``row`` is
    left as it is). Bias and penalties on tokens past the row's end are ignored (a draft
    model's row may be shorter than the target's vocabulary)."""
    out = np.array(row, dtype=np.float32, copy=True)
    n = out.size
    for token, bias in params.logit_bias:
        if token < n:
            out[token] += np.float32(bias)
    if params.presence_penalty == 0 and params.frequency_penalty == 0 and params.repeat_penalty == 1:
        return out
    seen = np.asarray(window(history, params), dtype=np.int64)
    if not seen.size:
        return out
    ids, counts = np.unique(seen[seen < n], return_counts=True)
    x = out[ids]
    if params.repeat_penalty != 1:
        r = np.float32(params.repeat_penalty)
        x = np.where(x <= 0, x * r, x / r)
    x = x - (counts * np.float32(params.frequency_penalty)
             + np.float32(params.presence_penalty)).astype(np.float32)
    out[ids] = x
    return out
