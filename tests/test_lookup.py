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


def test_lookup_drafter_follows_the_copy_it_proposed():
    """Two lines share "3 4": copying the first, once "3 4" has been written the most recent
    occurrence of the suffix is in the second line (its continuation: 8); the drafter goes on
    with the line it was copying (5 6), as the text has followed it so far."""
    d = LookupDrafter(max_ngram=2, min_ngram=2)
    params, rng = SamplingParams(), make_rng(0)
    text = [1, 2, 3, 4, 5, 6, 7, 3, 4, 8, 0]
    context = text + [1, 2]
    assert d.propose(context, 4, params, rng).tokens == [3, 4, 5, 6]  # the only (1, 2)
    context += [3, 4]  # the text followed the copy
    assert find_continuation(context, max_ngram=2, min_ngram=2, max_tokens=4).tokens == [8, 0, 1, 2]
    draft = d.propose(context, 4, params, rng)
    assert (draft.tokens, draft.ngram) == ([5, 6, 7, 3], 2)


def test_lookup_drafter_leaves_a_copy_the_text_left():
    d = LookupDrafter(max_ngram=2, min_ngram=2)
    params, rng = SamplingParams(), make_rng(0)
    context = [1, 2, 3, 4, 5, 6, 7, 3, 4, 8, 0, 1, 2]
    d.propose(context, 4, params, rng)
    context += [9, 3, 4]  # not what the copy said: back to the most recent occurrence
    assert d.propose(context, 4, params, rng).tokens == [8, 0, 1, 2]
    other = [1, 2, 3, 4, 5, 6, 7, 3, 4, 8, 0, 1, 2, 3, 4]  # another list: no copy to follow
    assert d.propose(other, 4, params, rng).tokens == [8, 0, 1, 2]
    # left and back: the last two tokens are the copy's again, but the text did not follow it
    context = [1, 2, 3, 4, 5, 6, 7, 4, 5, 8, 0, 1, 2]
    assert d.propose(context, 4, params, rng).tokens == [3, 4, 5, 6]
    context += [9, 4, 5]
    assert d.propose(context, 4, params, rng).tokens == [8, 0, 1, 2]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=4, max_size=40), st.integers(1, 3),
       st.integers(0, 3), st.lists(st.tuples(st.booleans(), st.integers(1, 5)), max_size=25))
def test_every_lookup_proposal_is_a_real_match(prompt, min_ngram, extra, steps):
    """Grown round by round, the text following the proposal or not: every proposal the
    drafter makes is the continuation of an earlier occurrence of the text's last ``ngram``
    tokens, min_ngram <= ngram <= max_ngram, and it proposes something exactly where the
    reference finds a match (following a copy changes which match, never whether)."""
    max_ngram = min_ngram + extra
    d = LookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    params, rng = SamplingParams(), make_rng(0)
    context = list(prompt)
    for follow, n_new in steps:
        draft = d.propose(context, 6, params, rng)
        ref = find_continuation(context, max_ngram=max_ngram, min_ngram=min_ngram,
                                max_tokens=6)
        assert bool(draft.tokens) == (ref is not None)
        if draft.tokens:
            n, k, end = draft.ngram, len(draft.tokens), len(context)
            assert min_ngram <= n <= max_ngram
            assert any(context[s - n:s] == context[end - n:] and context[s:s + k] == draft.tokens
                       for s in range(n, end))
        new = draft.tokens[:n_new] if follow and draft.tokens else [(len(context) * 7) % 5]
        context += new


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
