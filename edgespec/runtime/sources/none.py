"""Plain decoding through the same loop: the baseline everything is compared with."""

from __future__ import annotations

from .base import Draft, Drafter, SourceSpec


class NoDrafter(Drafter):
    """Proposes nothing: every round is one plain step."""

    name = "none"
    drafts = False

    def propose(self, context, k, params, rng) -> Draft:
        return Draft(source="none")


SPEC = SourceSpec("none", lambda kit: NoDrafter(), "plain decoding (the baseline)",
                  drafts=NoDrafter.drafts)
