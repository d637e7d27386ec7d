"""``auto``: each round, plain decoding or one of the registered sources ``auto`` may play (and
how many tokens), whichever :class:`~edgespec.core.policy.Policy` rates best under the
measured costs.

The policy prices two roles (:data:`~edgespec.runtime.sources.base.AutoRole`): a ``copy``
source (prompt lookup) proposes every round for ~nothing and is judged in the shadow: for a
one-hot draft x, P(accept) = p(x) = P(committed token == x), so comparing its proposal with
what the round committed estimates its acceptance even in rounds that did not play it; a
``paid`` source (the draft model) drafts at a measured price per token and learns its
acceptance where it plays. The registry says which registered source fills each role; the
policy names the roles by its own slots, ``lookup`` and ``model``.
"""

from __future__ import annotations

import time

from ...core.lookup import common_prefix
from ...core.policy import Offer, RoundOutcome
from ...errors import ConfigError
from .base import Draft, Drafter, Kit, Outcome, SourceSpec


class AutoDrafter(Drafter):
    """A thin adapter between the policy, which decides and learns, and the sources, which
    propose. ``lookup``: the copy source; ``model``: the paid source, or None."""

    name = "auto"

    def __init__(self, policy, lookup: Drafter, model: Drafter | None = None) -> None:
        self.policy = policy
        self.lookup = lookup
        self.model = model
        self.choices: dict[int, int] = {}  #: k -> rounds (k = 0: plain decoding step)
        self._shadow: Draft | None = None

    def propose(self, context, k, params, rng) -> Draft:
        t0 = time.perf_counter()
        shadow = self._shadow = self.lookup.propose(context, k, params, rng)
        self.policy.lookup_cost.observe(time.perf_counter() - t0)
        model = self.model is not None and self.policy.model_may_draft()
        behind = self.model.behind(context) if model else 1
        choice = self.policy.choose(Offer(
            k_max=k, lookup_len=len(shadow.tokens), ngram=shadow.ngram, model=model,
            behind=behind, wide=model and self.model.wide(behind)))
        self.choices[choice.k] = self.choices.get(choice.k, 0) + 1
        if choice.source == "lookup":
            return Draft(shadow.tokens[: choice.k], shadow.q[: choice.k], shadow.source,
                         shadow.ngram)
        if choice.source == "model":
            return self.model.propose(context, choice.k, params, rng)
        return Draft(source="none")

    def plain_next(self, k_max: int) -> bool:
        """Whether the round after this one (a plain step, proposed and not yet observed) will
        be plain too, whatever token the step commits (:meth:`Policy.plain_assured
        <edgespec.core.policy.Policy.plain_assured>`)."""
        shadow = self._shadow
        return self.policy.plain_assured(
            k_max, moved=shadow.ngram if shadow is not None and shadow.tokens else 0)

    def wants_prompt_cached(self, k: int) -> bool:
        """Only if the paid source could pay at all: otherwise its prefill is wasted time."""
        return self.model is not None and self.policy.model_can_pay(k)

    def observe(self, outcome: Outcome) -> None:
        """Hand the round to the policy, with the copy source's shadow verdict and the paid
        source's price."""
        shadow, lookup = self._shadow, None
        if shadow is not None and shadow.tokens:
            matched = common_prefix(shadow.tokens, outcome.new_tokens)
            # A mismatch is only seen if the round committed a token at that position.
            lookup = (shadow.ngram, matched,
                      matched < min(len(shadow.tokens), len(outcome.new_tokens)))
        draft = outcome.draft
        paid = self.model is not None and draft is not None and draft.source == self.model.name
        slot = ("model" if paid else "lookup") if outcome.drafted else "none"
        step = self.model.step_cost() if slot == "model" else None
        self.policy.observe(RoundOutcome(
            source=slot, width=outcome.drafted + 1, drafted=outcome.drafted,
            accepted=outcome.accepted, committed=len(outcome.new_tokens),
            t_target=outcome.t_target, t_draft=outcome.t_draft, lookup=lookup, draft_step=step))


def make_auto(kit: Kit) -> AutoDrafter:
    """``auto`` over the sources the registry offers it (``kit.offers``: one per role)."""
    if kit.policy is None:
        raise ConfigError("drafter 'auto' needs a cost policy")
    return AutoDrafter(kit.policy, kit.offers["copy"], kit.offers.get("paid"))


SPEC = SourceSpec("auto", make_auto,
                  "picks plain decoding or a source (and k) each round by measured cost",
                  draft_model="optional", chooser=True)
