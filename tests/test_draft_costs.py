"""What a draft-model round costs, as ``auto`` learns and charges it.

A round's first draft call also reads what the text gained since the model last drafted (after
lookup rounds: dozens of tokens), and on a GPU the calls after a wide one run without the draft
context's CUDA graph. The per-token price must come from steady calls only, and the catch-up
must be charged as what it is. Fakes on a fake clock: the loop logic, not llama.cpp's speed.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from edgespec.core.costs import CostCurve
from edgespec.core.policy import MODEL_GOES_ON, AcceptanceEstimate, CostEstimate, Policy
from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.runtime import drafters
from edgespec.runtime.drafters import (AutoDrafter, Draft, LookupDrafter, ModelDrafter,
                                       Outcome)

from .fakes import FakeLM, Table

GREEDY = SamplingParams(temperature=0)
STEADY, PENALTY, WIDE = 1.0e-3, 2.0e-3, 4.0e-3  # seconds on the fake GPU


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _GraphLM(FakeLM):
    """A draft model on a fake GPU clock: a call replays a graph (STEADY) only as the third or
    later single-token call in a row; any other call pays PENALTY more, and a wide one WIDE."""

    graph_shapes = True

    def __init__(self, clock: _Clock, **kw) -> None:
        super().__init__(Table(16, 3), **kw)
        self.clock = clock
        self.last, self.run = None, 0

    def decode(self, tokens, n_logits):
        width = len(tokens)
        replays = width == 1 and self.last == 1 and self.run >= 2
        self.clock.now += (STEADY if width == 1 else WIDE) + (0.0 if replays else PENALTY)
        self.run = self.run + 1 if width == self.last else 1
        self.last = width
        return super().decode(tokens, n_logits)

    def decode_argmax(self, tokens, n_logits):
        return np.argmax(self.decode(tokens, n_logits), axis=1).tolist()


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(drafters, "time", types.SimpleNamespace(perf_counter=fake))
    return fake


def _text(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(7).integers(0, 16, n)]


def test_the_per_token_price_comes_from_steady_calls_only(clock):
    """After the prefill (a wide call) the first two single calls run without a graph: a
    proposal's steady calls are those from the third single in a row on, and a proposal that
    had none (a 1-token draft, or steps right after a wide catch-up) says nothing."""
    lm = _GraphLM(clock, n_ctx=128)
    text = _text(80)
    lm.decode(text[:39], 0)  # the prefill: the model has read all but the last token
    model = ModelDrafter(lm, 16)
    context = text[:40]
    model.propose(context, 4, GREEDY, make_rng(0))  # calls: 1 (first, penalised), 3 steps
    assert model.step_cost() == pytest.approx(STEADY)  # steps 2 and 3; step 1 was penalised
    assert model.catch_up_excess(STEADY) == (1, False, pytest.approx(2 * PENALTY))
    assert model.behind(context) == 1  # its drafts beyond the text: all but one to read again

    context.extend(text[40:41])
    model.propose(context, 1, GREEDY, make_rng(0))  # one call: no steps
    assert model.step_cost() is None

    context.extend(text[41:61])  # 20 tokens from elsewhere (lookup rounds, say)
    assert model.behind(context) == 20 and model.wide(20)
    model.propose(context, 2, GREEDY, make_rng(0))  # a wide catch-up, then one step
    assert model.step_cost() is None  # (that step ran without a graph)
    fed, wide, excess = model.catch_up_excess(STEADY)
    assert (fed, wide) == (20, True)
    assert excess == pytest.approx(WIDE + 2 * PENALTY - STEADY)


def test_a_sampled_drafts_price_holds_the_hosts_work_on_it(clock, monkeypatch):
    """A sampled draft's distribution is host work on every drafted token (0.1-0.5 ms beside
    an H100): each step is timed from the end of the call before, so the price holds it."""
    lm = _GraphLM(clock, n_ctx=128)
    text = _text(80)
    lm.decode(text[:39], 0)
    real = drafters.draft_distribution

    def slow(*args, **kw):
        clock.now += 0.5e-3
        return real(*args, **kw)

    monkeypatch.setattr(drafters, "draft_distribution", slow)
    model = ModelDrafter(lm, 16, window=0)
    model.propose(text[:40], 5, SamplingParams(temperature=0.8), make_rng(0))
    assert model.step_cost() == pytest.approx(STEADY + 0.5e-3)


def test_a_catch_up_does_not_raise_autos_per_token_price(clock):
    """The regression: a 1-token model round after 20 tokens of lookup rounds cost a wide
    catch-up; booked as the price of its one drafted token, it raised the estimate ~4x, and the
    model, rated a loser from then on, never drafted again in that engine. Now the price stays
    put and the catch-up goes where it belongs."""
    lm = _GraphLM(clock, n_ctx=128)
    text = _text(60)
    lm.decode(text[:19], 0)
    policy = Policy(CostCurve({8: 3.76e-3}, width=8), CostEstimate(STEADY))
    auto = AutoDrafter(policy, LookupDrafter(), ModelDrafter(lm, 16))
    context = text[:40]  # 21 tokens the model has not read
    draft = auto.model.propose(context, 1, GREEDY, make_rng(0))
    auto.observe(Outcome(draft, 1, 1, [draft.tokens[0], 3], clock.now, 3.76e-3))
    assert policy.draft_cost.seconds == STEADY
    assert policy.wide_catch_up.seconds > 0.0


def test_catch_up_cost_by_how_the_model_reads():
    """In step: nothing; a short catch-up read a token a call: a call each, for the part of
    the time a lookup round would have come first (at the prior, half); a wide one: its
    width's price on the target's curve beyond one call, plus what wide ones cost beyond that
    lately (learned)."""
    cpu = Policy(CostCurve({1: 80e-3, 16: 960e-3}), CostEstimate(25e-3))
    assert cpu.catch_up_cost(1, False) == 0.0
    assert cpu.catch_up_cost(3, False) == pytest.approx(2 * 25e-3 * (1.0 - MODEL_GOES_ON))
    cpu.model_goes_on = AcceptanceEstimate(MODEL_GOES_ON, failures=1e9)  # lookup always came
    assert cpu.catch_up_cost(3, False) == pytest.approx(2 * 25e-3)
    linear = 25e-3 * (cpu.curve(16) / cpu.curve(1) - 1.0)
    assert cpu.catch_up_cost(16, True) == pytest.approx(linear)
    cpu.observe_catch_up(16, True, linear + 5e-3)  # it cost 5 ms more than its width says
    assert cpu.wide_catch_up.seconds == pytest.approx(0.2 * 5e-3)  # (CostEstimate's weight)
    assert cpu.catch_up_cost(16, True) == pytest.approx(linear + 1e-3)
    cpu.observe_catch_up(3, False, 1.0)  # a short one teaches nothing: it is a call each
    assert cpu.wide_catch_up.seconds == pytest.approx(1e-3)


def test_a_model_far_behind_is_rated_with_its_catch_up():
    """At a fixed width 8 (t = 3.76 ms a call, 1.3 ms a drafted token: the 2026-11-28 H100's
    exact mode) a model in step with acceptance 0.9 beats plain decoding; the same model with
    32 tokens to read, whose wide catch-ups cost 20 ms more, does not. A wide catch-up is
    rated at the power of two at or below its tokens, so one rating serves a stretch of plain
    steps."""
    policy = Policy(CostCurve({8: 3.76e-3}, width=8), CostEstimate(1.3e-3))
    policy.model = AcceptanceEstimate(0.9, successes=9.0, failures=1.0)
    assert policy.choose(16, last_shape=8, last_run=3).source == "model"
    policy.wide_catch_up = CostEstimate(20e-3)
    assert policy.choose(16, last_shape=8, last_run=3, behind=33, wide=True).source == "none"
    assert policy.model_declines(16, 8, 3, behind=40, wide=True)  # (rated as 32 too)
    assert not policy.model_declines(16, 8, 3, behind=64, wide=True)  # (no rating of 64 yet)


def test_a_short_catch_up_is_charged_as_far_as_lookup_would_save_it():
    """The regression: after a round whose drafts were all accepted, the model must read two
    tokens (its last draft and the bonus), a call more. Charged in full, that call made a model
    at acceptance 0.6 lose to plain decoding at a fixed width 8 (t = 3.76 ms, 1.28 ms a
    drafted token: the 2026-11-28 H100's exact mode); a plain step then left it further behind,
    and it sat out the rest of a chat answer (1.04x of ``none`` in ``scripts/gpu/replay.py``
    where the ``model`` drafter ran 1.19x). Plain decoding does not save that call, the model's
    next round owes it whenever it comes; only a lookup round in between does (the model then
    reads it with the rest, in one wide call). So it is charged for the part of the time that
    the model's next drafting round was lookup's."""
    def policy(goes_on: AcceptanceEstimate) -> Policy:
        p = Policy(CostCurve({8: 3.76e-3}, width=8), CostEstimate(1.28e-3))
        p.model = AcceptanceEstimate(0.6, successes=6.0, failures=4.0)  # alpha 0.6
        p.model_goes_on = goes_on
        return p

    own = policy(AcceptanceEstimate(MODEL_GOES_ON, successes=9.0))  # the model came back
    assert own.choose(16, last_shape=8, last_run=3, behind=2).source == "model"
    interrupted = policy(AcceptanceEstimate(MODEL_GOES_ON, failures=1e9))  # lookup came first
    assert interrupted.choose(16, last_shape=8, last_run=3, behind=2).source == "none"


def test_auto_learns_whose_round_follows_the_models(clock):
    """After a model round, the next drafting round (plain steps between do not count) was the
    model's again (it goes on) or lookup's (it broke off); rounds after lookup's say nothing."""
    lm = _GraphLM(clock, n_ctx=128)
    text = _text(60)
    lm.decode(text[:19], 0)
    policy = Policy(CostCurve({8: 3.76e-3}, width=8), CostEstimate(STEADY))
    auto = AutoDrafter(policy, LookupDrafter(), ModelDrafter(lm, 16))
    context = text[:20]
    goes_on = policy.model_goes_on

    def play(source: str) -> None:
        if source == "model":
            draft = auto.model.propose(context, 1, GREEDY, make_rng(0))
        elif source == "lookup":
            draft = Draft([5], [None], "lookup", 2)
        else:
            draft = Draft(source="none")
        committed = draft.tokens[:1] + [3]
        auto.observe(Outcome(draft, len(draft.tokens), len(draft.tokens), committed, 0.0,
                             3.76e-3))
        context.extend(committed)

    play("lookup")
    play("model")
    assert goes_on.evidence == 0.0  # (after lookup's round: nothing to learn)
    play("none")
    play("none")
    play("model")
    assert (goes_on.successes, goes_on.failures) == (1.0, 0.0)
    play("lookup")
    assert goes_on.failures == 1.0 and goes_on.alpha < MODEL_GOES_ON + 0.1
    play("model")
    assert goes_on.evidence < 2.0  # (faded, and nothing new: lookup's round came before)


def test_a_retrial_is_rated_as_if_the_model_were_in_step(clock):
    """The regression: a model refused early in an answer (acceptance 0.3 after two misses)
    sat out the rest of it, its re-trials included: by then it had dozens of tokens to read,
    and the re-trial was rated with that catch-up, which only grows while it waits. A re-trial
    is rated in step; its catch-up is what any return pays."""
    lm = _GraphLM(clock, n_ctx=128)
    text = _text(80)
    lm.decode(text[:19], 0)
    policy = Policy(CostCurve({8: 3.76e-3}, width=8), CostEstimate(1.28e-3))
    policy.model = AcceptanceEstimate(0.6, successes=0.3, failures=2.0)
    auto = AutoDrafter(policy, LookupDrafter(), ModelDrafter(lm, 16))
    auto.realized.banned_until["lookup"] = 10**9  # (no lookup offer: the model or nothing)
    context = text[:60]
    assert auto.model.wide(auto.model.behind(context))
    auto._since_model = auto._retry_after  # a re-trial is due
    assert auto.propose(context, 16, GREEDY, make_rng(0)).source == "model"
    assert auto._since_model == 0


@pytest.mark.parametrize("curve, per_token, pays", [
    # the 2026-11-28 H100, llama.cpp's default kernels: t(1) 2.05 ms, flat, P 1.3 ms
    (CostCurve({1: 2.05e-3, 4: 2.9e-3, 16: 4.6e-3}, switch_penalty=1.3e-3), 1.37e-3, False),
    # the same GPU in exact mode (fixed width 8)
    (CostCurve({8: 3.76e-3}, width=8), 1.28e-3, True),
])
def test_a_retrial_may_pay_only_where_the_prior_could(curve, per_token, pays):
    """A re-trial forgets the model's acceptance: the prior's 0.6 must be able to beat plain
    decoding for it to draft at all; where it cannot, the loop may launch the step ahead."""
    assert Policy(curve, CostEstimate(per_token)).retrial_may_pay(16) is pays
