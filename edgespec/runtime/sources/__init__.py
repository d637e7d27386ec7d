"""The sources of drafts, by name: the one list the CLI, the chat's cycle, bench, the server
and ``auto`` read.

Each source is one module of this package with a :class:`~.base.Drafter` subclass and its
:class:`~.base.SourceSpec` (what it needs, how ``auto`` may play it); :data:`REGISTRY` lists
the specs, in the order the faces show them. Adding a source is its module, its line below
and its tests: nothing else names it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ...config import (AUTO_MAX_DRAFT_LENGTH, DEFAULT_DRAFT_LENGTH, DEFAULT_MAX_NGRAM,
                       DEFAULT_MIN_NGRAM, DRAFT_WINDOW)
from ...errors import ConfigError
from . import auto, hybrid, lookup, model, mtp, none
from .base import Draft, Drafter, DraftModel, Kit, Outcome, SourceSpec

REGISTRY: dict[str, SourceSpec] = {spec.name: spec for spec in (
    auto.SPEC,
    hybrid.SPEC,
    mtp.SPEC,  # (before model: auto's paid source where the target has MTP layers)
    model.SPEC,
    lookup.SPEC,
    none.SPEC,
)}

#: every source's name, in the faces' order (the chat's ctrl+d cycle: most drafting first)
NAMES: tuple[str, ...] = tuple(REGISTRY)


def spec(name: str) -> SourceSpec:
    """The registry's entry for ``name``, else a ConfigError listing the sources."""
    found = REGISTRY.get(name)
    if found is None:
        raise ConfigError(f"unknown drafter {name!r}: choose one of {', '.join(NAMES)}")
    return found


def check_name(name: str) -> str:
    """``name`` if it is a source, else a ConfigError listing the sources."""
    return spec(name).name


def usable(has_draft_model: bool, has_mtp: bool = False) -> tuple[str, ...]:
    """The sources that can run with (or without) a draft model loaded and an MTP head on the
    target, in the faces' order."""
    return tuple(s.name for s in REGISTRY.values() if s.usable(has_draft_model, has_mtp))


def without_draft_model(name: str) -> str:
    """The source that runs for ``name`` where no draft model is loaded: itself if it can,
    else the registry's ``copy`` source (prompt lookup), which needs nothing."""
    if not spec(name).requires_draft_model:
        return name
    return next(s.name for s in REGISTRY.values() if s.auto_role == "copy")


def default_length(name: str) -> int:
    """The draft length a round asks for when the user set none: a source that chooses its
    length each round (``auto``) may go up to AUTO_MAX_DRAFT_LENGTH, the others draft
    DEFAULT_DRAFT_LENGTH."""
    return AUTO_MAX_DRAFT_LENGTH if spec(name).chooser else DEFAULT_DRAFT_LENGTH


def make_source(name: str, kit: Kit) -> Drafter:
    """Build the source ``name`` from ``kit``; a ConfigError if it needs what the kit lacks."""
    entry = spec(name)
    if not entry.usable(kit.draft_model is not None, kit.mtp is not None):
        raise ConfigError(_needs(entry))
    made = entry.make(replace(kit, offers=offered(kit)) if entry.chooser else kit)
    if entry.max_length is not None:
        made.max_length = entry.max_length
    return made


def _needs(entry: SourceSpec) -> str:
    """What a source that cannot run here lacks, in words."""
    if entry.extra_context:
        return (f"drafter {entry.name!r} needs a target with multi-token-prediction layers "
                "(e.g. Qwen3.5's MTP GGUFs)")
    return f"drafter {entry.name!r} needs a draft model (--draft)"


def check_usable(name: str, has_draft_model: bool, has_mtp: bool = False) -> None:
    """A ConfigError unless ``name`` can run with what is loaded."""
    entry = spec(name)
    if not entry.usable(has_draft_model, has_mtp):
        raise ConfigError(_needs(entry))


def offered(kit: Kit) -> dict[str, Drafter]:
    """For ``auto``: each role's source, built from ``kit`` (the first registered source of
    the role that can run here)."""
    roles: dict[str, Drafter] = {}
    for entry in REGISTRY.values():
        role = entry.auto_role
        if (role is not None and role not in roles
                and entry.usable(kit.draft_model is not None, kit.mtp is not None)):
            roles[role] = make_source(entry.name, kit)
    return roles


def make_drafter(name: str, draft_model: DraftModel | None = None, n_vocab: int = 0, *,
                 max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = DEFAULT_MIN_NGRAM,
                 policy=None, draft_window: int = DRAFT_WINDOW, guide=None) -> Drafter:
    """:func:`make_source` with the kit given as keywords."""
    return make_source(name, Kit(draft_model, n_vocab, max_ngram, min_ngram, draft_window,
                                 guide, policy))


__all__: Sequence[str] = (
    "REGISTRY", "NAMES", "Draft", "Drafter", "DraftModel", "Kit", "Outcome", "SourceSpec",
    "spec", "check_name", "check_usable", "usable", "without_draft_model", "default_length", "make_source",
    "offered", "make_drafter",
)
