"""Shaped and constrained rounds over scripted fakes: every drafter gives what plain decoding
under the same bias, penalties and constraint gives, token for token (greedy) and in
distribution (sampled); forced tokens are drafted as their own source; log-probabilities are
the raw rows'.

The constraint is :class:`tests.fakes.FakeMatcher`, a "grammar" whose allowed set depends on
every token before it, so a loop that masks a row against the wrong prefix, or does not roll
the constraint back after a rejection, emits tokens the reference would not.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from edgespec.core.penalties import shape, window
from edgespec.core.sampling import SamplingParams, distribution, make_rng
from edgespec.core.stats import Stats
from edgespec.runtime.drafters import make_drafter
from edgespec.runtime.guide import Guide, log_probs
from edgespec.runtime.loop import prefill, rounds

from .fakes import FakeLM, FakeMatcher, Perturbed, Table
from .stats_util import ALPHA, chi2_pvalue

V = 16
PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
GREEDY = SamplingParams(temperature=0)
SHAPED = SamplingParams(temperature=0, repeat_penalty=1.3, presence_penalty=0.4,
                        frequency_penalty=0.2, penalty_last_n=6, logit_bias={3: 2.0, 5: -1.0})
DRAFTERS = ("none", "lookup", "model", "hybrid")


def _models(seed: int = 4):
    table = Table(V, seed)
    return FakeLM(table, n_ctx=512), FakeLM(Perturbed(table, seed, 1.0), n_ctx=512)


def _generate(name, params, n, *, matcher_seed=None, seed=0, k=4, logprobs=None):
    target, draft = _models()
    matcher = FakeMatcher(V, matcher_seed) if matcher_seed is not None else None
    guide = Guide(params, matcher, logprobs=logprobs)
    drafter = make_drafter(name, draft, V, guide=guide)
    stats = Stats()
    prefill(target, PROMPT)
    out, rnds = [], []
    for rnd in rounds(target, drafter, PROMPT, params, make_rng(seed), k, stats, guide=guide):
        out += rnd.tokens
        rnds.append(rnd)
        if len(out) >= n:
            break
    return out[:n], rnds, stats, matcher


def _reference(params, n, *, matcher_seed=None):
    """Plain greedy decoding, written out: each step's row from the table, shaped against the
    context, masked by the fake grammar after the tokens generated so far, arg-max."""
    table = Table(V, 4)
    grammar = FakeMatcher(V, matcher_seed) if matcher_seed is not None else None
    context, out = list(PROMPT), []
    for _ in range(n):
        row = shape(table(context), params, list(window(context, params)))
        if grammar is not None:
            row[~grammar.allowed_after(out)] = -np.inf
        out.append(int(np.argmax(row)))
        context.append(out[-1])
    return out


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("case", ["constrained", "shaped", "both"])
def test_greedy_output_is_plain_decodings_under_the_same_shaping(name, case):
    params = GREEDY if case == "constrained" else SHAPED
    grammar = None if case == "shaped" else 7
    expected = _reference(params, 60, matcher_seed=grammar)
    out, rnds, stats, _ = _generate(name, params, 60, matcher_seed=grammar)
    assert out == expected
    if name != "none":
        assert stats.drafted > 0
    if name == "none":
        assert set(stats.by_drafter) == {"none"}  # plain decoding drafts nothing, not even forced


def test_every_emitted_token_is_allowed_where_it_stands_and_the_matcher_ends_on_the_text():
    out, rnds, stats, matcher = _generate("model", SamplingParams(temperature=1.0), 80,
                                          matcher_seed=3, seed=5)
    grammar = FakeMatcher(V, 3)
    for i, token in enumerate(out):
        assert grammar.allows(out[:i], token), i
    # the matcher's state is the committed text: every rejected draft was rolled back
    emitted = [t for r in rnds for t in r.tokens]
    assert matcher.consumed == emitted
    assert ("pop", 1) in matcher.log or any(op == "pop" for op, _ in matcher.log)


def test_forced_tokens_are_drafted_as_their_own_source_and_never_rejected():
    out, rnds, stats, _ = _generate("lookup", GREEDY, 80, matcher_seed=7)
    forced = stats.by_drafter.get("forced")
    assert forced is not None and forced.drafted > 0
    assert forced.accepted == forced.drafted  # the grammar allows nothing else there
    assert all(r.accepted == r.drafted for r in rnds if r.drafter == "forced")


def test_lookup_proposals_the_constraint_refuses_are_cut_before_scoring():
    target, draft = _models()
    matcher = FakeMatcher(V, 7)
    guide = Guide(GREEDY, matcher)
    drafter = make_drafter("lookup", None, V, guide=guide)
    prefill(target, PROMPT)
    grammar = FakeMatcher(V, 7)
    done: list[int] = []
    for rnd in rounds(target, drafter, PROMPT, GREEDY, make_rng(0), 8, Stats(), guide=guide):
        if rnd.drafter == "lookup":
            scored = target.calls[-1].tokens[1:]  # [last committed] + drafts
            assert grammar.valid_after(done, scored) == len(scored)
        done += rnd.tokens
        if len(done) > 60:
            break


@pytest.mark.parametrize("name", ["model", "lookup"])
def test_sampled_output_has_the_masked_targets_distribution(name):
    # the first two tokens' joint law, exactly: p(a) p(b | a), each masked and renormalised
    params = SamplingParams(temperature=1.0)
    table, grammar = Table(V, 4), FakeMatcher(V, 11)

    def law(context, generated):
        row = table(context).astype(np.float64)
        row[~grammar.allowed_after(generated)] = -np.inf
        p = np.exp(row - row.max())
        return p / p.sum()

    first = law(PROMPT, [])
    expected = {}
    for a in np.flatnonzero(first):
        second = law(PROMPT + [int(a)], [int(a)])
        for b in np.flatnonzero(second):
            expected[(int(a), int(b))] = first[a] * second[b]
    n = 3000
    counts = Counter(tuple(_generate(name, params, 2, matcher_seed=11, seed=s)[0])
                     for s in range(n))
    assert chi2_pvalue(counts, expected) > ALPHA


def test_logprobs_are_the_raw_rows_log_softmax_whatever_the_shaping():
    out, rnds, _, _ = _generate("model", SHAPED, 30, matcher_seed=7, logprobs=3)
    table, context = Table(V, 4), list(PROMPT)
    got = [lp for r in rnds for lp in r.logprobs][:30]
    for token, (own, top) in zip(out, got):
        row = table(context).astype(np.float64)
        lse = row.max() + math.log(np.exp(row - row.max()).sum())
        assert own == pytest.approx(row[token] - lse, abs=1e-5)
        assert [t for t, _ in top] == list(np.argsort(-row, kind="stable")[:3])
        assert [lp for _, lp in top] == pytest.approx(sorted(row - lse, reverse=True)[:3], abs=1e-5)
        context.append(token)


def test_log_probs_of_a_row():
    row = np.array([0.0, 2.0, 1.0, 2.0], np.float32)
    own, top = log_probs(row, 2, 2)
    lse = math.log(sum(math.exp(v) for v in row))
    assert own == pytest.approx(1.0 - lse)
    assert [t for t, _ in top] == [1, 3]  # ties: lower id first


def test_a_row_with_one_allowed_token_is_that_token_without_its_logits():
    guide = Guide(SamplingParams(temperature=1.0), FakeMatcher(V, 7))
    ahead: list[int] = []
    while guide.only(ahead) is None:  # walk the grammar until a forced position
        allowed = np.flatnonzero(FakeMatcher(V, 7).allowed_after(ahead))
        ahead.append(int(allowed[0]))
    only = guide.only(ahead)
    nan_row = np.full(V, np.nan, np.float32)  # never read
    assert guide.distribution(distribution, nan_row, ahead).sample(make_rng(0)) == only
