"""Prompt-lookup n-gram matching (find_continuation) and the lookup drafter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.core.lookup import LookupMatch, NgramIndex, find_continuation
from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.errors import ConfigError
from edgespec.runtime.drafters import RESUME_SKIP, RESUME_WITHIN, LookupDrafter


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


SOURCE = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # the prompt's line the answer copies (ids unique)


def _copy_then(drafter, committed):
    """Rounds of the loop on SOURCE + [0] + [1, 2]: lookup proposes the copy (k = 2), each
    round commits ``committed``'s next tokens (the verdict); returns the proposals made."""
    params, rng = SamplingParams(), make_rng(0)
    context = SOURCE + [0, 1, 2]
    proposals = []
    for new in committed:
        proposals.append(drafter.propose(context, 2, params, rng))
        context += new
    proposals.append(drafter.propose(context, 4, params, rng))
    return proposals


def test_lookup_resumes_a_copy_after_an_insertion():
    """Adding ": int" after a parameter: the copy breaks where the insertion starts, and the
    token after it that the copy has next (here 5) takes the copy up again at once, with
    ngram 1; the n-gram index alone would wait for two copied tokens."""
    d = LookupDrafter(max_ngram=3, min_ngram=2)
    # round 1 copies [3, 4] and the bonus 5; round 2 goes on with the copy ([6, 7]) and is
    # refuted at once by 50 (inserted), then 51 (inserted), then 6: the copy's next token
    drafts = _copy_then(d, [[3, 4, 5], [50], [51], [6]])
    assert [p.tokens for p in drafts[:4]] == [[3, 4], [6, 7], [], []]
    assert (drafts[4].tokens, drafts[4].ngram) == ([7, 8, 9, 0], 1)
    assert find_continuation(SOURCE + [0, 1, 2, 3, 4, 5, 50, 51, 6], max_ngram=3, min_ngram=2,
                             max_tokens=4) is None  # what the index alone finds: nothing


def test_a_resumed_copy_that_is_followed_breaks_afresh():
    """The resumed copy is followed for a round, then left at its first token (70): that is
    the new break, and the text coming back to it (0) resumes there. (Had the first break
    been kept, the text would be 7 tokens past it: no resume.)"""
    d = LookupDrafter(max_ngram=3, min_ngram=2)
    drafts = _copy_then(d, [[3, 4, 5], [50], [6], [7, 8, 9], [70], [0]])
    assert [p.tokens for p in drafts[:6]] == [[3, 4], [6, 7], [], [7, 8], [0, 1], []]
    assert drafts[3].ngram == 1 and drafts[4].ngram >= 2  # resumed, then followed
    assert (drafts[6].tokens, drafts[6].ngram) == ([1, 2, 3, 4], 1)


def test_lookup_resumes_past_replaced_or_dropped_tokens():
    """A renamed token (6 -> 60) or a dropped one (6 missing): the text comes back to the
    copy up to RESUME_SKIP tokens past where it broke."""
    assert RESUME_SKIP >= 1
    renamed = _copy_then(LookupDrafter(max_ngram=3, min_ngram=2), [[3, 4, 5], [60], [7]])
    assert (renamed[-1].tokens, renamed[-1].ngram) == ([8, 9, 0, 1], 1)
    dropped = _copy_then(LookupDrafter(max_ngram=3, min_ngram=2), [[3, 4, 5], [7]])
    assert dropped[-1].tokens == [8, 9, 0, 1]
    past = 6 + RESUME_SKIP + 1  # (the copy's next token is 6; RESUME_SKIP more; one too far)
    assert _copy_then(LookupDrafter(max_ngram=3, min_ngram=2),
                      [[3, 4, 5], [past]])[-1].tokens == []


def test_lookup_resumes_only_near_the_break():
    """An insertion of RESUME_WITHIN tokens or more (the text has gone elsewhere): no resume."""
    inserted = [[50 + i] for i in range(RESUME_WITHIN - 1)]
    near = _copy_then(LookupDrafter(max_ngram=3, min_ngram=2), [[3, 4, 5], *inserted, [6]])
    assert near[-1].tokens == [7, 8, 9, 0]
    far = _copy_then(LookupDrafter(max_ngram=3, min_ngram=2), [[3, 4, 5], *inserted, [59], [6]])
    assert far[-1].tokens == []


def test_a_fresh_match_refuted_at_once_leaves_the_break():
    """After the break the index finds another match (the earlier line 50 51 52 53), which is
    refuted at its first token: that was never a copy of the text, so the copy that broke is
    still the one to resume (a guard that, if moved, would resume from 52 and propose []).
    In another list there is no break to resume."""
    d = LookupDrafter(max_ngram=3, min_ngram=2)
    params, rng = SamplingParams(), make_rng(0)
    context = [50, 51, 52, 53] + SOURCE + [0, 1, 2]
    assert d.propose(context, 2, params, rng).tokens == [3, 4]
    context += [3, 4, 5]
    assert d.propose(context, 2, params, rng).tokens == [6, 7]
    context += [50]
    assert d.propose(context, 2, params, rng).tokens == []
    context += [51]
    assert d.propose(context, 2, params, rng).tokens == [52, 53]  # the index's match
    context += [6]  # refuted at once: the text came back to the copy
    assert d.propose(context, 4, params, rng).tokens == [7, 8, 9, 0]
    assert d.propose(list(context), 4, params, rng).tokens == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=4, max_size=40), st.integers(1, 3),
       st.integers(0, 3), st.lists(st.tuples(st.booleans(), st.integers(1, 5)), max_size=25))
def test_every_lookup_proposal_is_a_real_match(prompt, min_ngram, extra, steps):
    """Grown round by round, the text following the proposal or not: every proposal the
    drafter makes is the continuation of an earlier occurrence of the text's last ``ngram``
    tokens, and it proposes something wherever the reference finds a match (following a copy
    changes which match, never whether), with min_ngram <= ngram <= max_ngram. Where the
    reference finds none, a proposal can only be a resumed copy: ngram 1."""
    max_ngram = min_ngram + extra
    d = LookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    params, rng = SamplingParams(), make_rng(0)
    context = list(prompt)
    for follow, n_new in steps:
        draft = d.propose(context, 6, params, rng)
        ref = find_continuation(context, max_ngram=max_ngram, min_ngram=min_ngram,
                                max_tokens=6)
        if ref is not None:
            assert draft.tokens
        if draft.tokens:
            n, k, end = draft.ngram, len(draft.tokens), len(context)
            assert min_ngram <= n <= max_ngram if ref is not None else n == 1
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
