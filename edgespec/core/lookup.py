"""Prompt-lookup n-gram drafting (Saxena 2023; Leviathan et al. 2023 section 4's "copy" drafter).

Find the longest suffix n-gram of the text so far (prompt + generated) that also occurs earlier,
and propose the tokens that followed that earlier occurrence. Code edits, refactors and quoting
copy long spans of the prompt, so the proposals are often right, and they cost nothing to make.

Pure NumPy; no model involved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class LookupMatch:
    """A proposal: the continuation tokens and the length of the n-gram that matched."""

    tokens: list[int]
    ngram: int
    #: where in the text the continuation starts (-1: not told); not part of equality
    start: int = field(default=-1, compare=False)


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
            return LookupMatch(arr[start : start + max_tokens].tolist(), n, start)
    return None


class NgramIndex:
    """:func:`find_continuation` in O(new tokens) per call instead of O(context).

    For every n-gram size it keeps a dict from each n-gram to where the continuation of its
    most recent occurrence starts. The index follows one growing token list (the loop's
    committed tokens, extended in place); given another list, or a shorter one, it rebuilds.
    """

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._source: object = None
        self._done = 0  #: continuation starts < _done are indexed
        self._maps: dict[int, dict[tuple[int, ...], int]] = {}

    def find(self, tokens: list[int], max_tokens: int) -> LookupMatch | None:
        """The same answer as ``find_continuation(tokens, ...)``."""
        if max_tokens <= 0 or self.min_ngram < 1:
            return None
        n_tok = len(tokens)
        if tokens is not self._source or n_tok < self._done:
            self._source, self._done = tokens, 0
            self._maps = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        # a window is a candidate if at least one token follows it: starts s <= n_tok - 1
        for n, grams in self._maps.items():
            for s in range(max(self._done, n), n_tok):
                grams[tuple(tokens[s - n:s])] = s
        self._done = n_tok
        # A longer suffix seen before means its shortest one was too (same continuation): a
        # miss there is a miss for every n, one look instead of one per n (most rounds of
        # free text).
        shortest = self.min_ngram
        if n_tok - 1 >= shortest and tuple(tokens[n_tok - shortest:]) not in self._maps[shortest]:
            return None
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            s = self._maps[n].get(tuple(tokens[n_tok - n:]))
            if s is not None:
                return LookupMatch(tokens[s:s + max_tokens], n, s)
        return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``: a KV cache and a wanted prefix,
    or a one-hot draft and the tokens committed after it (its accepted run under greedy)."""
    n = min(len(a), len(b))
    if list(b[:n]) == a[:n]:  # the usual case each round (lists), compared at C speed
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
