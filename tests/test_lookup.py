"""Prompt-lookup n-gram matching (find_continuation) and the lookup drafter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.core.lookup import LookupMatch, NgramIndex, find_continuation
from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.errors import ConfigError
from edgespec.runtime.drafters import LookupDrafter


def find(tokens, max_ngram=4, min_ngram=1, max_tokens=8):
    return find_continuation(tokens, max_ngram=max_ngram, min_ngram=min_ngram, max_tokens=max_tokens)


def test_continuation_of_the_earlier_occurrence():
    assert find([1, 2, 3, 4, 5, 9, 1, 2, 3]) == LookupMatch([4, 5, 9, 1, 2, 3], 3)


def test_longest_ngram_wins_over_a_more_recent_shorter_one():
    # suffix [7, 1, 2]: the 3-gram occurs at the start (-> 30); [1, 2] alone recurs later (-> 20)
    toks = [7, 1, 2, 30, 31, 1, 2, 20, 21, 7, 1, 2]
    assert find(toks, max_tokens=2) == LookupMatch([30, 31], 3)
    assert find(toks, max_ngram=2, max_tokens=2) == LookupMatch([20, 21], 2)


def test_most_recent_occurrence_of_the_same_ngram():
    toks = [1, 2, 10, 11, 1, 2, 20, 21, 5, 1, 2]
    assert find(toks, max_tokens=2) == LookupMatch([20, 21], 2)


def test_max_ngram_limits_the_match_length():
    # a 4-gram match exists, but with max_ngram=3 the most recent 3-gram is used
    toks = [9, 1, 2, 3, 40, 1, 2, 3, 50, 9, 1, 2, 3]
    assert find(toks, max_ngram=4, max_tokens=1) == LookupMatch([40], 4)
    assert find(toks, max_ngram=3, max_tokens=1) == LookupMatch([50], 3)


def test_min_ngram_rejects_shorter_matches():
    toks = [5, 6, 7, 8, 5]  # only the 1-gram [5] recurs
    assert find(toks, min_ngram=1) == LookupMatch([6, 7, 8, 5], 1)
    assert find(toks, min_ngram=2) is None


def test_no_match_is_none():
    assert find([1, 2, 3, 4, 5]) is None
    assert find([]) is None
    assert find([3]) is None


def test_max_tokens_truncates_and_zero_means_nothing():
    toks = [1, 2, 3, 4, 5, 6, 1, 2]
    assert find(toks, max_tokens=3) == LookupMatch([3, 4, 5], 2)
    assert find(toks, max_tokens=100).tokens == [3, 4, 5, 6, 1, 2]
    assert find(toks, max_tokens=0) is None


def test_the_suffix_does_not_match_itself():
    # [1, 2] occurs only as the suffix: no earlier occurrence, no proposal
    assert find([5, 1, 2], min_ngram=2) is None
    # the whole sequence is the only occurrence of every n >= 2 suffix
    assert find([1, 2, 3], min_ngram=1) is None


def test_repeated_token_run():
    # In a run, the most recent earlier occurrence overlaps the suffix; its continuation is
    # the run's token (here a single one: the occurrence ends one token before the end).
    m = find([4, 7, 7, 7, 7, 7], max_ngram=3, min_ngram=2)
    assert m is not None and m.ngram == 3 and m.tokens and set(m.tokens) == {7}
    assert find([7, 7], max_ngram=4, min_ngram=1) == LookupMatch([7], 1)


def test_periodic_text_proposes_up_to_the_end_of_the_text():
    # The most recent occurrence of the suffix [1, 2, 3, 1] is one period back (index 6), so
    # the proposal runs from there to the end of the text: 3 tokens although 5 are allowed.
    toks = [1, 2, 3] * 4 + [1]
    assert find(toks, max_ngram=4, min_ngram=2, max_tokens=5) == LookupMatch([2, 3, 1], 4)


def test_numpy_input():
    arr = np.array([1, 2, 3, 4, 1, 2], dtype=np.int32)
    assert find(arr, max_tokens=2) == LookupMatch([3, 4], 2)
    assert all(isinstance(t, int) for t in find(arr, max_tokens=2).tokens)


def test_bad_ngram_bounds_give_none():
    assert find([1, 2, 1, 2], min_ngram=0) is None
    assert find([1, 2, 1, 2], max_ngram=1, min_ngram=2) is None


def test_lookup_drafter_proposes_one_hot_drafts():
    d = LookupDrafter(max_ngram=3, min_ngram=2)
    draft = d.propose([1, 2, 3, 4, 1, 2], 2, SamplingParams(), make_rng(0))
    assert (draft.tokens, draft.q, draft.source, draft.ngram) == ([3, 4], [None, None], "lookup", 2)
    empty = d.propose([1, 2, 3], 2, SamplingParams(), make_rng(0))
    assert (empty.tokens, empty.source) == ([], "lookup")


@pytest.mark.parametrize("max_ngram,min_ngram", [(2, 3), (3, 0)])
def test_lookup_drafter_rejects_bad_ngram_sizes(max_ngram, min_ngram):
    with pytest.raises(ConfigError):
        LookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=80), st.integers(1, 4),
       st.integers(1, 6), st.integers(0, 6))
def test_ngram_index_equals_find_continuation(tokens, min_ngram, extra, max_tokens):
    """The incremental index answers like the reference at every length the list grows
    through, and rebuilds for another (or a shorter) list."""
    max_ngram = min_ngram + extra
    index = NgramIndex(max_ngram, min_ngram)
    live: list[int] = []
    steps = [tokens[:i] for i in range(0, len(tokens) + 1, 3)] + [tokens]
    for target in steps:
        live.extend(target[len(live):])
        want = find_continuation(live, max_ngram=max_ngram, min_ngram=min_ngram,
                                 max_tokens=max_tokens)
        assert index.find(live, max_tokens) == want
    other = list(tokens[: len(tokens) // 2])
    want = find_continuation(other, max_ngram=max_ngram, min_ngram=min_ngram,
                             max_tokens=max_tokens)
    assert index.find(other, max_tokens) == want
