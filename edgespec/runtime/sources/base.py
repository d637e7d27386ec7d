"""What a source of drafts is, and what it declares about itself.

A source looks at the committed tokens (prompt + generated) and proposes up to ``k`` next
tokens, each with the processed distribution it was sampled from (``None`` for a one-hot
proposal). The target scores them all in one call and the exact sampler judges them
(:mod:`edgespec.runtime.loop`). Everything the loop and ``auto`` ask of a source is a method of
:class:`Drafter` with a default, so a source overrides only what it does; what it needs to be
built (a draft model, an extra context, the target's hidden state, a cap on its drafts' length)
and how ``auto`` may play it is its :class:`SourceSpec`, the registry's entry
(:mod:`edgespec.runtime.sources`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Protocol, Sequence

import numpy as np

from ...config import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, DRAFT_WINDOW
from ...core.dist import AnyDist
from ...core.sampling import SamplingParams


@dataclass
class Draft:
    """Proposed tokens, the distributions they were drawn from, and who proposed them."""

    tokens: list[int] = field(default_factory=list)
    q: list[AnyDist | None] = field(default_factory=list)
    source: str = "none"
    ngram: int = 0  #: for lookup: length of the matched n-gram


@dataclass(frozen=True)
class Outcome:
    """What one round did, reported back to sources that learn (``auto``)."""

    draft: Draft | None
    drafted: int  #: tokens actually scored as drafts (the loop may cap the proposal)
    accepted: int
    new_tokens: list[int]  #: tokens committed this round
    t_draft: float
    t_target: float


class DraftModel(Protocol):
    """What a model-backed source needs from a backend (:class:`~edgespec.runtime.backend.LlamaBackend`)."""

    n_ctx: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...

    # What more it can do, it declares (:mod:`edgespec.runtime.capabilities`): ``argmax``
    # (greedy drafts then never bring a row of logits to the host), ``device_window`` (the
    # device takes a sampled draft's window: no row reaches the host either), ``graph_shapes``
    # (a short catch-up then goes a token a call, on a replayed graph).


class Drafter:
    """A source of drafts. ``propose`` is the one method every source has; the others are the
    hooks the loop and ``auto`` call, with what a source that does not care answers."""

    name: str = "none"
    #: whether it drafts at all (plain decoding does not: the constraint's forced tokens are
    #: not drafted for it either, so that it stays the baseline)
    drafts: bool = True
    #: the longest draft this source may propose (None: as long as the round allows)
    max_length: int | None = None

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Up to ``k`` tokens to follow ``context``."""
        raise NotImplementedError

    def observe(self, outcome: Outcome) -> None:
        """What the round this source proposed for did (sources that learn)."""

    def plain_next(self, k_max: int) -> bool:
        """Asked while a plain step's call runs: whether the step after it is plain whatever
        this one commits (an asynchronous loop then launches it first)."""
        return False

    def wants_prompt_cached(self, k: int) -> bool:
        """Whether the draft model's cache should hold the prompt before the first round."""
        return False


@dataclass(frozen=True)
class Kit:
    """What a source's factory may build it from: one record for every source."""

    draft_model: DraftModel | None = None
    n_vocab: int = 0
    max_ngram: int = DEFAULT_MAX_NGRAM
    min_ngram: int = DEFAULT_MIN_NGRAM
    #: the draft model's sampled proposals come from its this many most likely tokens (0: all)
    draft_window: int = DRAFT_WINDOW
    #: the generation's shaping (:class:`~edgespec.runtime.guide.Guide`): a draft model's rows
    #: get the same bias, penalties and mask
    guide: object | None = None
    #: ``auto``'s :class:`~edgespec.core.policy.Policy`
    policy: object | None = None
    #: the target's MTP head and the hidden rows it reads (:mod:`.mtp`), where it has one
    mtp: tuple | None = None
    #: for a source that plays the others (``auto``): the registry's source for each role
    #: that can run here (:func:`edgespec.runtime.sources.offered`)
    offers: Mapping[str, "Drafter"] = field(default_factory=dict)


#: how ``auto`` prices a source: ``copy`` proposes one-hot copies for ~nothing and is judged
#: every round in the shadow (its acceptance chain per matched n-gram); ``paid`` drafts at a
#: measured price per token, its acceptance learned where it plays
AutoRole = Literal["copy", "paid"]


@dataclass(frozen=True)
class SourceSpec:
    """A source's registry entry: how to build it and what it needs."""

    name: str
    make: Callable[[Kit], Drafter]
    #: one line for help texts and the chat's drafter cycle
    summary: str
    #: whether it drafts at all (``none`` is plain decoding, the baseline)
    drafts: bool = True
    #: ``required``: it cannot run without a draft model; ``optional``: it uses one if loaded
    draft_model: Literal["required", "optional"] | None = None
    #: it needs a context of its own on the target's model (an MTP head), and the target's
    #: hidden state each round
    extra_context: bool = False
    hidden_state: bool = False
    #: the longest draft it may propose (None: no cap of its own)
    max_length: int | None = None
    #: how ``auto`` offers it (None: ``auto`` does not)
    auto_role: AutoRole | None = None
    #: it plays the other registered sources (``auto``)
    chooser: bool = False

    @property
    def uses_draft_model(self) -> bool:
        return self.draft_model is not None

    @property
    def requires_draft_model(self) -> bool:
        return self.draft_model == "required"

    def usable(self, has_draft_model: bool, has_mtp: bool = False) -> bool:
        """Whether it can run with (or without) a draft model loaded, and with (or without) an
        MTP head on the target."""
        return ((has_draft_model or not self.requires_draft_model)
                and (has_mtp or not self.extra_context))


class _Defaults(Drafter):
    """A source written without the base class (anything with ``propose``), given the base
    class's answers for the hooks it lacks."""

    def __init__(self, source) -> None:
        self.source = source
        self.name = getattr(source, "name", "custom")
        self.max_length = getattr(source, "max_length", None)
        self.drafts = getattr(source, "drafts", self.name != "none")
        self.propose = source.propose
        for hook in ("observe", "plain_next", "wants_prompt_cached"):
            if callable(getattr(source, hook, None)):
                setattr(self, hook, getattr(source, hook))


def as_drafter(source) -> Drafter:
    """``source`` as a :class:`Drafter`: itself where it is one."""
    return source if isinstance(source, Drafter) else _Defaults(source)
