"""The sources' registry and base class: what the faces read, what a source declares, and that
the loop honours it (a source's own cap on its drafts' length, the hooks' defaults)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.costs import CallCosts, CostCurve
from edgespec.core.policy import CostEstimate, Policy
from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.core.stats import Stats
from edgespec.errors import ConfigError
from edgespec.runtime import sources
from edgespec.runtime.loop import prefill, rounds
from edgespec.runtime.sources.base import Draft, Drafter, Kit, SourceSpec, as_drafter

from .fakes import FakeLM, Table, pair

GREEDY = SamplingParams(temperature=0)
PROMPT = [1, 2, 3, 4, 1, 2, 3]


def _policy() -> Policy:
    return Policy(CallCosts(CostCurve({1: 1e-2, 8: 2e-2})), CostEstimate(1e-3))


def test_the_registry_lists_every_source_once_in_the_faces_order():
    assert sources.NAMES == ("auto", "hybrid", "mtp", "model", "lookup", "none")
    assert all(sources.spec(n).name == n for n in sources.NAMES)
    assert [n for n in sources.NAMES if not sources.spec(n).drafts] == ["none"]
    assert [n for n in sources.NAMES if sources.spec(n).chooser] == ["auto"]


def test_what_each_source_needs_decides_where_it_can_run():
    assert sources.usable(True, True) == sources.NAMES
    assert sources.usable(True) == ("auto", "hybrid", "model", "lookup", "none")
    assert sources.usable(False) == ("auto", "lookup", "none")
    assert sources.usable(False, True) == ("auto", "mtp", "lookup", "none")
    assert {n for n in sources.NAMES if sources.spec(n).uses_draft_model} == {"auto", "hybrid", "model"}
    assert sources.without_draft_model("mtp") == "mtp"
    with pytest.raises(ConfigError, match="needs a draft model"):
        sources.make_source("hybrid", Kit())
    with pytest.raises(ConfigError, match="multi-token-prediction layers"):
        sources.make_source("mtp", Kit())
    with pytest.raises(ConfigError, match="unknown drafter 'magic': choose one of auto, hybrid"):
        sources.check_name("magic")


def test_auto_takes_each_role_from_the_registry_where_it_can_run():
    target, draft = pair(8)
    alone = sources.make_source("auto", Kit(n_vocab=8, policy=_policy()))
    assert alone.lookup.name == "lookup" and alone.model is None
    both = sources.make_source("auto", Kit(draft, 8, policy=_policy()))
    assert both.lookup.name == "lookup" and both.model.name == "model"
    assert both.model.model is draft
    with pytest.raises(ConfigError, match="cost policy"):
        sources.make_source("auto", Kit())


def test_the_base_class_answers_every_hook_a_source_does_not_care_about():
    class Bare(Drafter):
        name = "bare"

        def propose(self, context, k, params, rng):
            return Draft(source="bare")

    bare = Bare()
    assert bare.max_length is None and not bare.plain_next(8) and not bare.wants_prompt_cached(8)
    assert bare.observe(None) is None

    class Duck:  # a source written without the base class
        name = "duck"
        seen = []

        def propose(self, context, k, params, rng):
            return Draft(source="duck")

        def observe(self, outcome):
            self.seen.append(outcome)

    duck = as_drafter(Duck())
    assert isinstance(duck, Drafter) and duck.name == "duck" and not duck.plain_next(4)
    duck.observe("round")
    assert Duck.seen == ["round"]
    assert as_drafter(bare) is bare


class _Long(Drafter):
    """Proposes the same ten tokens whatever the text (most rejected)."""

    name = "long"

    def __init__(self, cap=None):
        self.max_length = cap
        self.asked = []

    def propose(self, context, k, params, rng):
        self.asked.append(k)
        return Draft([1] * 10, [None] * 10, "long")


@pytest.mark.parametrize("cap", [None, 2])
def test_the_loop_never_drafts_past_a_sources_own_cap_and_stays_exact(cap):
    target = FakeLM(Table(8, seed=2), n_ctx=128)
    reference = FakeLM(Table(8, seed=2), n_ctx=128)
    prefill(reference, PROMPT)
    want, last = [], PROMPT[-1]
    for _ in range(20):
        last = int(reference.decode([last], 1)[0].argmax())
        want.append(last)
    source = _Long(cap)
    prefill(target, PROMPT)
    got, drafted = [], []
    for rnd in rounds(target, source, PROMPT, GREEDY, make_rng(0), 6, Stats()):
        got += rnd.tokens
        drafted.append(rnd.drafted)
        if len(got) >= 20:
            break
    assert got[:20] == want
    assert max(drafted) == (6 if cap is None else cap)
    assert set(source.asked) <= ({6} if cap is None else {2})


def test_a_registered_spec_can_cap_its_source():
    spec = SourceSpec("capped", lambda kit: _Long(), "test", max_length=3)
    registry = dict(sources.REGISTRY, capped=spec)
    try:
        sources.REGISTRY.clear()
        sources.REGISTRY.update(registry)
        made = sources.make_source("capped", Kit())
    finally:
        del registry["capped"]
        sources.REGISTRY.clear()
        sources.REGISTRY.update(registry)
    assert made.max_length == 3


def test_the_mtp_sources_hidden_rows_are_the_committed_tokens_and_bounded():
    from edgespec.runtime.sources.mtp import HiddenRows

    class Head:
        n_embd = 2

        def __init__(self):
            self.rows = np.zeros((0, 2), np.float32)

        def target_rows(self, n):
            return self.rows[:n]

    head = Head()
    kept = HiddenRows(head, keep=8)
    head.rows = np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    kept(10, np.array([5, 6, 7]))  # a call at positions 10..12
    head.rows = np.array([[9, 9]], np.float32)
    kept(11, np.array([8]))  # the round's rejected draft at 11 decoded again as 8
    # a row counts only for the token read there; the others read as zero rows
    assert kept.take([5, 8, 7], 10).tolist() == [[1, 1], [9, 9], [3, 3]]
    assert kept.take([5], 10).tolist() == [[0, 0]]  # (taken: forgotten)
    head.rows = np.ones((1, 2), np.float32)
    for p in range(100, 200):
        kept(p, np.array([1]))
    assert len(kept.rows) <= 10 and max(kept.rows) == 199
