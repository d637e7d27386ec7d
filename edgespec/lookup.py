"""Prompt-lookup n-gram drafting (Saxena 2023; Leviathan et al. 2023 section 4's "copy" drafter).

Find the longest suffix n-gram of the text so far (prompt + generated) that also occurs earlier,
and propose the tokens that followed that earlier occurrence. Code edits, refactors and quoting
copy long spans of the prompt, so the proposals are often right, and they cost nothing to make.

Pure NumPy; no model involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class LookupMatch:
    """A proposal: the continuation tokens and the length of the n-gram that matched."""

    tokens: list[int]
    ngram: int


def find_continuation(
    tokens: Sequence[int] | np.ndarray, *, max_ngram: int, min_ngram: int, max_tokens: int
) -> LookupMatch | None:
    """Longest-suffix n-gram lookup.

    Tries n = max_ngram down to min_ngram; for the first n whose suffix occurs earlier in
    ``tokens``, takes the most recent earlier occurrence and returns up to ``max_tokens`` tokens
    that followed it. Returns None when no suffix of length >= min_ngram recurs.
    """
    if max_tokens <= 0 or min_ngram < 1:
        return None
    arr = np.asarray(tokens, dtype=np.int64)
    n_tok = arr.size
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        suffix = arr[n_tok - n :]
        # Candidate starts i in [0, n_tok - n - 1]: the window arr[i:i+n] must be followed by at
        # least one token, so it cannot be the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(arr[: n_tok - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return LookupMatch(arr[start : start + max_tokens].tolist(), n)
    return None


def matched_prefix(proposal: Sequence[int], actual: Sequence[int]) -> int:
    """How many leading tokens of ``proposal`` equal ``actual`` (the accepted run of a one-hot
    draft under greedy decoding, or its shadow comparison)."""
    n = 0
    for a, b in zip(proposal, actual):
        if a != b:
            break
        n += 1
    return n
