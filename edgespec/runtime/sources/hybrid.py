"""Lookup where the text has a recurring n-gram, the draft model otherwise: a fixed mix, for
comparing with ``auto``'s measured one."""

from __future__ import annotations

from .base import Draft, Drafter, SourceSpec
from .lookup import LookupDrafter
from .model import ModelDrafter


class HybridDrafter(Drafter):
    """Lookup when the text so far has a recurring n-gram; the draft model otherwise."""

    name = "hybrid"

    def __init__(self, lookup: LookupDrafter, model: ModelDrafter):
        self.lookup = lookup
        self.model = model

    def propose(self, context, k, params, rng) -> Draft:
        draft = self.lookup.propose(context, k, params, rng)
        if draft.tokens:
            return draft
        return self.model.propose(context, k, params, rng)

    def wants_prompt_cached(self, k: int) -> bool:
        return True


SPEC = SourceSpec(
    "hybrid",
    lambda kit: HybridDrafter(LookupDrafter(kit.max_ngram, kit.min_ngram),
                              ModelDrafter(kit.draft_model, kit.n_vocab, kit.draft_window,
                                           kit.guide)),
    "lookup where it matches, else the draft model", draft_model="required")
