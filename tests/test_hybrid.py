"""Hybrid targets and drafts (recurrent layers beside attention) on real llama.cpp: tiny
random-weight ``qwen35`` (Gated DeltaNet) and ``lfm2`` (short convolutions) GGUFs written by
:mod:`edgespec.models.synthetic`. Greedy output with every source equals plain decoding token
for token, with and without a constraint; a rejected draft is rolled back through llama.cpp's
snapshots (never a re-read of the context); a prompt that diverges inside the cache reads again
from a checkpoint; the sampled law holds with a hybrid draft model."""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams, process
from edgespec.models import synthetic

from .real_util import GREEDY, ids
from .stats_util import ALPHA, chi2_pvalue

pytestmark = pytest.mark.real

DRAFTERS = ("none", "lookup", "model", "hybrid", "auto")
PROMPTS = (
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
)
CHOICE = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes, certainly", "no, never"]},
                   "why": {"type": "string", "maxLength": 20}},
    "required": ["answer", "why"],
    "additionalProperties": False,
}


def _engine(target: str, draft: str, *, mtp: bool = False, **kw):
    from edgespec.runtime.engine import Engine

    return Engine.load(str(synthetic.cached(target, mtp=mtp)), str(synthetic.cached(draft)),
                       drafter="model", n_ctx=1024, progress=False, **kw)


@pytest.fixture(scope="module", params=[("qwen35-tiny", "lfm2-tiny"), ("lfm2-tiny", "qwen35-tiny")],
                ids=["qwen35", "lfm2"])
def hybrid_engine(request):
    """A hybrid target with a hybrid draft of other weights (most drafts are rejected)."""
    with _engine(*request.param) as engine:
        yield engine


@pytest.fixture(scope="module")
def mtp_engine():
    """The tiny qwen35 with an MTP layer (its own drafter), and a hybrid draft model beside."""
    with _engine("qwen35-tiny", "lfm2-tiny", mtp=True) as engine:
        yield engine


@pytest.fixture(scope="module")
def self_drafting():
    """The tiny qwen35 drafting for itself: every draft is accepted."""
    with _engine("qwen35-tiny", "qwen35-tiny") as engine:
        yield engine


def _rollbacks(engine):
    memory = engine.target.context.recurrent
    return memory.restores, memory.rereads


def test_a_hybrid_target_plays_long_drafts_in_calls_it_can_take_back(hybrid_engine):
    engine = hybrid_engine
    target = engine.target
    assert target.recurrent and engine.draft.recurrent
    # the CPU's pieces of 3: one call's snapshots take back two tokens
    assert target.draft_reach == 2
    restores, rereads = _rollbacks(engine)
    plain = engine.complete(PROMPTS[0], drafter="none", max_tokens=24, chat=False,
                            sampling=GREEDY)
    out = engine.complete(PROMPTS[0], drafter="model", draft_length=8, max_tokens=24,
                          chat=False, sampling=GREEDY)
    assert ids(out) == ids(plain)
    # a round of 8 drafts: calls that each judge at most 3 of them
    assert len(out.stats.drafted_hist) == 4 and out.stats.drafted_hist[3] > 0
    assert _rollbacks(engine)[1] == rereads


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_plain_decoding_with_every_source(hybrid_engine, prompt):
    engine = hybrid_engine
    restores, rereads = _rollbacks(engine)
    outs = {d: engine.complete(prompt, drafter=d, max_tokens=40, chat=False, sampling=GREEDY)
            for d in DRAFTERS}
    plain = ids(outs["none"])
    assert len(plain) == 40
    for d, out in outs.items():
        assert ids(out) == plain, d
    drafted = outs["model"].stats
    assert drafted.drafted > drafted.accepted  # drafts were rejected and rolled back
    # every request after the first reads from a checkpoint, never from the start again
    assert _rollbacks(engine)[1] == rereads


def test_greedy_equals_plain_decoding_when_every_draft_is_accepted(self_drafting):
    outs = {d: self_drafting.complete(PROMPTS[1], drafter=d, max_tokens=40, chat=False,
                                      sampling=GREEDY, draft_length=8)
            for d in ("none", "model", "auto")}
    assert ids(outs["model"]) == ids(outs["none"]) == ids(outs["auto"])
    stats = outs["model"].stats
    assert stats.drafted > 0 and stats.accepted == stats.drafted


def test_constrained_greedy_equals_plain_decoding(hybrid_engine):
    outs = {d: hybrid_engine.complete(PROMPTS[1], drafter=d, json_schema=CHOICE, max_tokens=60,
                                      chat=False, sampling=GREEDY) for d in DRAFTERS}
    plain = ids(outs["none"])
    for d, out in outs.items():
        assert ids(out) == plain, d
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), CHOICE)
    forced = outs["lookup"].stats.by_drafter["forced"]
    assert forced.drafted > 0 and forced.accepted == forced.drafted


def test_a_prompt_diverging_inside_the_cache_reads_from_a_checkpoint(hybrid_engine):
    engine = hybrid_engine
    first = engine.complete(PROMPTS[0], drafter="model", max_tokens=16, chat=False,
                            sampling=GREEDY)
    restores, rereads = _rollbacks(engine)
    # the same prompt again: the cache holds it and the answer; the answer is cut off
    again = engine.complete(PROMPTS[0], drafter="model", max_tokens=16, chat=False,
                            sampling=GREEDY)
    assert ids(again) == ids(first)
    assert _rollbacks(engine) == (restores + 1, rereads)
    assert again.stats.cached_prompt_tokens > 0


def test_a_rejected_draft_is_taken_back_exactly(hybrid_engine):
    """The cache after rounds with rejections scores the next token as a fresh context does."""
    engine = hybrid_engine
    out = engine.complete(PROMPTS[1], drafter="model", max_tokens=20, chat=False,
                          sampling=GREEDY)
    assert out.stats.drafted > out.stats.accepted
    target = engine.target
    held = list(target.tokens)
    assert held == engine.prompt_tokens(PROMPTS[1], chat=False) + ids(out)[:-1]
    row = np.array(target.decode([ids(out)[-1]], 1)[0])
    target.reset()
    fresh = np.array(target.decode(held + [ids(out)[-1]], 1)[0])
    # (the fresh context reads the held tokens in one prefill: the same argmax, close rows)
    assert int(np.argmax(row)) == int(np.argmax(fresh))
    assert np.allclose(row, fresh, atol=1e-2)


def test_sampled_tokens_follow_the_target_distribution_with_a_hybrid_draft(hybrid_engine):
    _check_law(hybrid_engine, "model")


def _check_law(engine, drafter: str) -> None:
    """Temperature 1 with top-k 3 (a small support on these flat random models): the first two
    tokens over 400 seeded runs against the target's own law, enumerated exactly."""
    params = SamplingParams(temperature=1.0, top_k=3)
    prompt = PROMPTS[1]
    n_runs = 400
    outcomes: Counter = Counter()
    for seed in np.random.default_rng(7).integers(0, 2**31, size=n_runs):
        out = engine.complete(prompt, drafter=drafter, draft_length=2, max_tokens=2, chat=False,
                              sampling=SamplingParams(temperature=1.0, top_k=3, seed=int(seed)))
        outcomes[tuple(ids(out))] += 1
    target = engine.target
    ctx = engine.prompt_tokens(prompt, chat=False)
    target.sync(ctx[:-1])
    p1 = process(np.array(target.decode(ctx[-1:], 1)[0]), params)
    expected = {}
    for x1 in np.flatnonzero(p1):
        n = target.sync(ctx)  # (may go back to a checkpoint: read what it lacks)
        p2 = process(np.array(target.decode([*ctx[n:], int(x1)], 1)[0]), params)
        for x2 in np.flatnonzero(p2):
            expected[(int(x1), int(x2))] = float(p1[x1] * p2[x2])
    assert chi2_pvalue(outcomes, expected) > ALPHA


def test_mtp_greedy_equals_plain_decoding_alone_and_under_auto(mtp_engine):
    engine = mtp_engine
    assert engine.mtp is not None
    for prompt in PROMPTS:
        outs = {d: engine.complete(prompt, drafter=d, max_tokens=32, chat=False, sampling=GREEDY)
                for d in ("none", "mtp", "auto", "model", "lookup")}
        plain = ids(outs["none"])
        for d, out in outs.items():
            assert ids(out) == plain, d
        assert outs["mtp"].stats.by_drafter["mtp"].drafted > 0
    constrained = {d: engine.complete(PROMPTS[1], drafter=d, json_schema=CHOICE, max_tokens=48,
                                      chat=False, sampling=GREEDY) for d in ("none", "mtp")}
    assert ids(constrained["mtp"]) == ids(constrained["none"])


def test_mtp_is_offered_only_where_the_target_has_the_layers(mtp_engine, hybrid_engine):
    from edgespec.errors import ConfigError
    from edgespec.runtime import sources

    assert "mtp" in sources.usable(True, mtp_engine.mtp is not None)
    assert hybrid_engine.mtp is None
    with pytest.raises(ConfigError, match="multi-token-prediction"):
        hybrid_engine.complete(PROMPTS[0], drafter="mtp", max_tokens=4, chat=False)


def test_mtp_sampled_tokens_follow_the_target_distribution(mtp_engine):
    _check_law(mtp_engine, "mtp")


def test_a_conversation_reuses_its_cache_turn_after_turn(hybrid_engine):
    """Chat turns through the model's template: each turn's prompt extends the last answer,
    so the target reads only what is new (no checkpoint, no re-read)."""
    engine = hybrid_engine
    messages = [{"role": "user", "content": "Name three colours."}]
    first = engine.complete(messages, drafter="model", max_tokens=12, sampling=GREEDY)
    restores, rereads = _rollbacks(engine)
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "And three more."}]
    second = engine.complete(messages, drafter="model", max_tokens=12, sampling=GREEDY)
    assert second.stats.cached_prompt_tokens > 0
    assert _rollbacks(engine)[1] == rereads
