"""What a draft-model round costs, as ``auto`` learns and charges it.

A round's first draft call also reads what the text gained since the model last drafted (after
lookup rounds: dozens of tokens), and on a GPU the calls after a wide one run without the draft
context's CUDA graph. The per-token price must come from steady calls only, and what the model
must read first is charged by how it reads it. Fakes on a fake clock: the loop logic, not
llama.cpp's speed.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.costs import CallCosts, CostCurve
from edgespec.core.policy import CostEstimate, Offer, Policy, PolicyConfig, RoundOutcome
from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.runtime.sources import auto as auto_source
from edgespec.runtime.sources import model as model_source
from edgespec.runtime.drafters import (AutoDrafter, Draft, LookupDrafter, ModelDrafter,
                                       Outcome)

from .fakes import Clock, Table, TimedLM, use_clock

GREEDY = SamplingParams(temperature=0)
STEADY, PENALTY, WIDE = 1.0e-3, 2.0e-3, 4.0e-3  # seconds on the fake GPU
#: the tunables these tests lean on, set here (not the defaults, which are tuned elsewhere)
CONFIG = PolicyConfig(margin=0.03, prior_weight=2.0, model_prior=0.7, retrial_wait=(8, 64))
#: the 2026-11-28 H100 in exact mode: a fixed width 8, 3.76 ms a call
EXACT = 3.76e-3


def _exact_costs() -> CallCosts:
    return CallCosts(CostCurve({8: EXACT}, width=8))


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return use_clock(monkeypatch, Clock(), model_source, auto_source)


def _graph_lm(clock: Clock, **kw) -> TimedLM:
    """A draft model on a fake GPU clock: a single-token call replays a graph (STEADY) from the
    third in a row on; the first two of a width pay PENALTY more, and a wide call is WIDE."""
    return TimedLM(Table(16, 3), clock, lambda w: STEADY if w == 1 else WIDE,
                   changed=PENALTY, second=PENALTY, **kw)


def _text(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(7).integers(0, 16, n)]


def test_the_per_token_price_comes_from_steady_calls_only(clock):
    """After the prefill (a wide call) the first two single calls run without a graph: a
    proposal's steady calls are those from the third single in a row on, and a proposal that
    had none (a 1-token draft, or steps right after a wide catch-up) says nothing."""
    lm = _graph_lm(clock, n_ctx=128)
    text = _text(80)
    lm.decode(text[:39], 0)  # the prefill: the model has read all but the last token
    model = ModelDrafter(lm, 16)
    context = text[:40]
    start = clock.now
    model.propose(context, 4, GREEDY, make_rng(0))  # calls: 1 (first, penalised), 3 steps
    assert lm.widths[-4:] == [1, 1, 1, 1]
    assert clock.now - start == pytest.approx(4 * STEADY + 2 * PENALTY)  # (the fake's clock)
    assert model.step_cost() == pytest.approx(STEADY)  # steps 2 and 3; step 1 was penalised
    assert model.behind(context) == 1  # its drafts beyond the text: all but one to read again

    context.extend(text[40:41])
    model.propose(context, 1, GREEDY, make_rng(0))  # one call: no steps
    assert model.step_cost() is None

    context.extend(text[41:61])  # 20 tokens from elsewhere (lookup rounds, say)
    assert model.behind(context) == 20 and model.wide(20)
    model.propose(context, 2, GREEDY, make_rng(0))  # a wide catch-up, then one step
    assert lm.widths[-2:] == [20, 1]
    assert model.step_cost() is None  # (that step ran without a graph)


def test_a_sampled_drafts_price_holds_the_hosts_work_on_it(clock, monkeypatch):
    """A sampled draft's distribution is host work on every drafted token (0.1-0.5 ms beside
    an H100): each step is timed from the end of the call before, so the price holds it."""
    lm = _graph_lm(clock, n_ctx=128)
    text = _text(80)
    lm.decode(text[:39], 0)
    real = model_source.draft_distribution

    def slow(*args, **kw):
        clock.now += 0.5e-3
        return real(*args, **kw)

    monkeypatch.setattr(model_source, "draft_distribution", slow)
    model = ModelDrafter(lm, 16, window=0)
    model.propose(text[:40], 5, SamplingParams(temperature=0.8), make_rng(0))
    assert model.step_cost() == pytest.approx(STEADY + 0.5e-3)


def test_a_catch_up_does_not_raise_autos_per_token_price_and_steady_steps_set_it(clock):
    """The regression: a 1-token model round after 20 tokens of lookup rounds cost a wide
    catch-up; booked as the price of its one drafted token, it raised the estimate ~4x, and the
    model, rated a loser from then on, never drafted again in that engine. Now that round says
    nothing about the price; a round with steady steps moves it towards what they cost."""
    lm = _graph_lm(clock, n_ctx=128)
    text = _text(60)
    lm.decode(text[:19], 0)
    policy = Policy(_exact_costs(), CostEstimate(2 * STEADY), CONFIG)
    auto = AutoDrafter(policy, LookupDrafter(), ModelDrafter(lm, 16))
    context = text[:40]  # 21 tokens the model has not read
    start = clock.now
    draft = auto.model.propose(context, 1, GREEDY, make_rng(0))
    assert clock.now - start == pytest.approx(WIDE + PENALTY)  # (one wide call)
    committed = [draft.tokens[0], 3]
    auto.observe(Outcome(draft, 1, 1, committed, clock.now - start, EXACT))
    assert policy.draft_cost.seconds == 2 * STEADY
    context += committed  # the model reads two tokens a call each, then drafts 4
    draft = auto.model.propose(context, 4, GREEDY, make_rng(0))
    assert auto.model.step_cost() == pytest.approx(STEADY)
    auto.observe(Outcome(draft, 4, 4, draft.tokens + [3], 0.0, EXACT))
    assert policy.draft_cost.seconds == pytest.approx(2 * STEADY + 0.2 * (STEADY - 2 * STEADY))


def test_the_models_drafting_is_priced_by_how_it_reads_what_it_lacks():
    """c_model(k): a call per drafted token after the first; the first also reads what the
    model lacks: in step nothing more; a short catch-up a call a token; a wide one one call,
    priced at that width's share of the target's curve (never below one call)."""
    d = 25e-3
    cpu = Policy(CallCosts(CostCurve({1: 80e-3, 16: 960e-3})), CostEstimate(d), CONFIG)
    k = np.arange(1, 5)
    assert cpu.model_drafting(4) == pytest.approx(d * k)
    assert cpu.model_drafting(4, behind=1, wide=True) == pytest.approx(d * k)
    assert cpu.model_drafting(4, behind=3) == pytest.approx(d * (k + 2))
    assert cpu.model_drafting(4, behind=16, wide=True) == pytest.approx(d * (k - 1 + 12))
    exact = Policy(_exact_costs(), CostEstimate(d), CONFIG)
    assert exact.model_drafting(4, behind=20, wide=True) == pytest.approx(d * (k - 1 + 3))
    assert exact.model_drafting(4, behind=5, wide=True) == pytest.approx(d * k)


def test_a_model_far_behind_is_rated_with_what_it_reads_first():
    """At a fixed width 8 (3.76 ms a call, 1.3 ms a drafted token: the 2026-11-28 H100's exact
    mode) a model in step with acceptance ~0.9 beats plain decoding, and still does with 33
    tokens to read in one wide call (5 calls' worth); with 64 to read it does not, in one call
    or a call each."""
    policy = Policy(_exact_costs(), CostEstimate(1.3e-3), CONFIG)
    policy.model.successes, policy.model.failures = 90.0, 10.0  # (prior 0.7 at weight 2)
    assert policy.model.alpha == pytest.approx((90.0 + 1.4) / 102.0)
    assert policy.choose(Offer(16)).source == "model"
    assert policy.choose(Offer(16, behind=33, wide=True)).source == "model"
    assert policy.choose(Offer(16, behind=64, wide=True)).source == "none"
    assert policy.choose(Offer(16, behind=64)).source == "none"


def test_auto_hands_each_round_to_the_policy_as_it_was_played(clock):
    """AutoDrafter is an adapter: each round reaches the policy with its source (``none``
    where nothing was scored), its call's width, what it drafted, accepted and committed, its
    times, lookup's shadow verdict (its proposal, played or not, against what was committed)
    and the draft model's steady price where it drafted."""
    lm = _graph_lm(clock, n_ctx=256)
    context = [1, 2, 3, 4, 5, 6, 7, 8] * 3  # (lookup's proposal: 1, 2, 3, ... again)
    lm.decode(context[:-1], 0)
    policy = Policy(_exact_costs(), CostEstimate(STEADY), CONFIG)
    seen: list[RoundOutcome] = []
    observe = policy.observe
    policy.observe = lambda outcome: seen.append(outcome) or observe(outcome)
    auto = AutoDrafter(policy, LookupDrafter(), ModelDrafter(lm, 16))

    auto.propose(context, 8, GREEDY, make_rng(0))  # (a shadow: lookup's copy of 1 .. 8)
    shadow = LookupDrafter().propose(context, 8, GREEDY, make_rng(0))
    assert shadow.tokens[:3] == [1, 2, 3]
    played = Draft(shadow.tokens[:4], shadow.q[:4], "lookup", shadow.ngram)
    auto.observe(Outcome(played, 4, 2, [1, 2, 9], 1e-4, 5e-3))  # two accepted, then 9
    assert seen[-1] == RoundOutcome("lookup", 5, 4, 2, 3, 5e-3, 1e-4, (shadow.ngram, 2, True))
    context += [1, 2, 9]

    auto.propose(context, 8, GREEDY, make_rng(0))
    draft = auto.model.propose(context, 4, GREEDY, make_rng(0))
    auto.observe(Outcome(draft, 3, 3, draft.tokens[:3] + [0], 2e-3, 4e-3))  # (the loop cut it)
    step = auto.model.step_cost()
    assert step is not None
    assert seen[-1].source == "model" and seen[-1].draft_step == step
    assert (seen[-1].width, seen[-1].drafted, seen[-1].accepted, seen[-1].committed) == (4, 3, 3, 4)
    context += draft.tokens[:3] + [0]

    auto.propose(context, 8, GREEDY, make_rng(0))
    auto.observe(Outcome(draft, 0, 0, [5], 0.0, 3e-3))  # (a draft the loop scored none of)
    assert seen[-1].source == "none" and (seen[-1].width, seen[-1].draft_step) == (1, None)
    assert len(seen) == 3


def _refused(policy: Policy) -> Policy:
    """The draft model rated a loser (many misses), and no lookup offer (banned)."""
    policy.model.successes, policy.model.failures = 0.0, 20.0
    policy.realized.banned_until["lookup"] = 10**9
    return policy


def test_a_refused_model_is_tried_again_after_the_retrial_wait(clock):
    """A model refused early in an answer (two dozen misses) must not sit out the rest of it:
    after ``retrial_wait`` rounds without it, its acceptance is forgotten and it drafts again
    at the prior, wherever that can pay, though by then it has the plain steps to read first."""
    lm = _graph_lm(clock, n_ctx=128)
    text = _text(80)
    lm.decode(text[:19], 0)
    policy = _refused(Policy(_exact_costs(), CostEstimate(1.0e-3), CONFIG))
    auto = AutoDrafter(policy, LookupDrafter(), ModelDrafter(lm, 16))
    context = text[:20]
    sources = []
    for _ in range(CONFIG.retrial_wait[0] + 1):
        behind = auto.model.behind(context)
        draft = auto.propose(context, 16, GREEDY, make_rng(0))
        sources.append(draft.source)
        if draft.source != "none":
            break
        auto.observe(Outcome(draft, 0, 0, [3], 0.0, EXACT))
        context.append(3)
    assert sources == ["none"] * CONFIG.retrial_wait[0] + ["model"]
    assert behind == CONFIG.retrial_wait[0] + 1  # (rated with what it had to read)


@pytest.mark.parametrize("costs, per_token, pays", [
    # the 2026-11-28 H100, llama.cpp's default kernels: S(1) 2.05 ms, flat; U and C 1.3 ms
    (lambda: CallCosts(CostCurve({1: 2.05e-3, 4: 2.9e-3, 16: 4.6e-3}), 1.3e-3, 1.3e-3,
                       graphs=True), 1.37e-3, False),
    # the same GPU in exact mode (fixed width 8)
    (_exact_costs, 1.28e-3, True),
], ids=["gpu", "exact"])
def test_a_due_retrial_unassures_plain_steps_only_where_the_prior_could_pay(costs, per_token,
                                                                            pays):
    """A re-trial forgets the model's acceptance: the prior must be able to beat plain
    decoding for it to draft at all. So a plain step is assured (the loop may launch the one
    after it ahead) up to the re-trial, and where the prior cannot pay, through it too."""
    policy = _refused(Policy(costs(), CostEstimate(per_token), CONFIG))
    wait = CONFIG.retrial_wait[0]
    for _ in range(wait - 2):
        t = policy.costs(policy.costs.shape(1), policy.last_width, policy.run)
        policy.observe(RoundOutcome("none", 1, 0, 0, 1, t, 0.0))
    assert policy.plain_assured(16)  # the step proposed now is the (wait - 1)th: not yet due
    assert policy.choose(Offer(16)).source == "none"
    t = policy.costs(policy.costs.shape(1), policy.last_width, policy.run)
    policy.observe(RoundOutcome("none", 1, 0, 0, 1, t, 0.0))
    assert policy.plain_assured(16) is not pays  # the step proposed now brings the re-trial
    assert policy.choose(Offer(16)).source == "none"
    t = policy.costs(policy.costs.shape(1), policy.last_width, policy.run)
    policy.observe(RoundOutcome("none", 1, 0, 0, 1, t, 0.0))
    assert policy.choose(Offer(16)).source == ("model" if pays else "none")
