"""Which draft model speculates for a target: the catalog's pair for a known target, else the
smallest catalog draft whose tokenizer matches the target's GGUF metadata, else none (lookup
drafting only). A target that carries MTP layers can also draft with those (``--drafter mtp``):
:func:`mtp_note` says so beside the draft model picked.

A draft's tokenizer comes from the catalog, from its file when it is here, or from the first
megabytes of its GGUF on the hub (a ranged read: the header holds the vocabulary), remembered in
``<cache>/tokenizers/`` by the file's sha256. The prediction is checked again, token by token, when
the runtime loads the pair (``check_compatible``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

from edgespec.config import cache_dir
from edgespec.errors import EdgespecError
from edgespec.models.catalog import Catalog, Entry, HfSource, HubEntry, ModelEntry, hub_ref_of, load_catalog
from edgespec.models.gguf_meta import (
    ArchInfo,
    GGUFError,
    TokenizerInfo,
    compatible,
    read_tokenizer,
    tokenizer_of,
)
from edgespec.models.hubref import DEFAULT_QUANT, HubRef, quant_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftChoice:
    """The draft picked for a target (a catalog model name; ``None``: lookup drafting only) and why."""

    draft: str | None
    reason: str


@dataclass(frozen=True)
class Candidate:
    """A catalog draft judged against a target: ``problem`` is ``None`` when it is compatible."""

    name: str
    problem: str | None


def known_target(target: str, path: Path | None, catalog: Catalog) -> str | None:
    """The catalog model a target argument is, if any: its name, a hub reference to it, or a
    file the cache verified as it (path and sha256 marker)."""
    if target in catalog.models:
        return target
    ref = hub_ref_of(target)
    if ref is not None:
        entry = find_entry(ref, catalog)
        return entry.name if entry is not None else None
    if path is not None:
        for entry in catalog.models.values():
            if isinstance(entry, ModelEntry) and _same_pinned_file(path, entry):
                return entry.name
    return None


def _same_pinned_file(path: Path, entry: ModelEntry) -> bool:
    from edgespec.models import download as dl

    try:
        return path.stat().st_size == entry.size and dl.has_valid_marker(path, entry.sha256)
    except OSError:
        return False


def find_entry(ref: HubRef, catalog: Catalog) -> Entry | None:
    """The catalog entry a hub reference names: a hub entry of that repository and quant, or a
    pinned model whose hub source is that repository's file of that quant."""
    hub_entry = catalog.find_hub(ref)
    if hub_entry is not None:
        return hub_entry
    for entry in catalog.models.values():
        if not isinstance(entry, ModelEntry):
            continue
        for src in entry.sources:
            if not isinstance(src, HfSource) or src.repo.lower() != ref.repo.lower():
                continue
            if ref.filename is not None:
                if ref.filename.lower() == src.filename.lower():
                    return entry
            elif quant_of(src.filename) == (ref.quant or DEFAULT_QUANT).upper():
                return entry
    return None


def choose_draft(target: str | None, target_path: Path, *, catalog: Catalog | None = None,
                 online: bool = True) -> DraftChoice:
    """The draft for ``target`` (the user's argument; ``None`` is unnamed) at ``target_path``.
    Drafts are judged only until one fits (judging one not here reads its header from the hub)."""
    return _judge(target, target_path, catalog or load_catalog(), online, every=False)[0]


def judge_all(target: str | None, target_path: Path, *, catalog: Catalog | None = None,
              online: bool = True) -> tuple[DraftChoice, list[tuple[str, str | None]]]:
    """The draft :func:`choose_draft` picks, and every catalog draft, smallest first, with why it
    cannot draft for the target (``None``: it can). A known target's catalog pair comes first."""
    return _judge(target, target_path, catalog or load_catalog(), online, every=True)


def _judge(target: str | None, target_path: Path, catalog: Catalog, online: bool, *,
           every: bool) -> tuple[DraftChoice, list[tuple[str, str | None]]]:
    name = known_target(target or "", target_path, catalog)
    pair = catalog.pair_for_target(name) if name is not None else None
    choice = None
    if pair is not None:
        choice = DraftChoice(pair.draft, f"the catalog pairs {name} with it (pair '{pair.name}')")
        if not every:
            return choice, []
    label = target or target_path.name
    try:
        info, tokens = tokenizer_of(target_path)
    except (GGUFError, OSError) as err:
        if pair is not None:
            return choice, [(pair.draft, None)]
        return (DraftChoice(None, f"cannot read the tokenizer of {label} ({err}): lookup drafting only"),
                [("-", f"cannot read the target's tokenizer ({err})")])
    rows: list[tuple[str, str | None]] = []
    for cand in candidates(info, tokens, target_path, catalog, online=online):
        rows.append((cand.name, None if pair is not None and cand.name == pair.draft else cand.problem))
        if choice is None and cand.problem is None:
            choice = DraftChoice(cand.name, f"the smallest catalog draft whose tokenizer matches "
                                            f"{label}'s ({_describe(info)})")
            if not every:
                break
    if choice is None:
        choice = DraftChoice(None, f"no catalog draft shares {label}'s tokenizer ({_describe(info)}): "
                                   "lookup drafting only")
    if pair is not None:
        rows.sort(key=lambda r: r[0] != pair.draft)
    return choice, rows


def mtp_note(label: str, arch: ArchInfo, choice: DraftChoice) -> str | None:
    """Why a target that carries MTP layers may need no draft model: ``--drafter mtp`` drafts
    with the target's own multi-token-prediction layers, and ``choice``'s draft (a separate
    file, same tokenizer) is the alternative. ``None`` when ``arch`` has no MTP layer."""
    if not arch.mtp_layers:
        return None
    layers = f"{arch.mtp_layers} MTP layer{'s' if arch.mtp_layers != 1 else ''}"
    own = f"{label} carries {layers}: `--drafter mtp` drafts with the model's own layers (no second model)"
    if choice.draft is None:
        return f"{own}; no catalog draft model shares its tokenizer"
    return f"{own}; the alternative is the draft model {choice.draft} (same tokenizer, `--drafter model`)"


def _describe(info: TokenizerInfo) -> str:
    pre = f"/{info.pre}" if info.pre else ""
    return f"{info.model}{pre}, {info.n_tokens} tokens"


def candidates(info: TokenizerInfo, tokens: Sequence[str], target_path: Path | None,
               catalog: Catalog, *, online: bool = True) -> Iterator[Candidate]:
    """Every catalog draft, smallest first, with why it cannot draft for this target (``None``:
    it can); lazily, since judging a draft not yet here reads its header from the hub. The
    target's own file is never its draft."""
    for entry in catalog.drafts():
        local = local_path(entry)
        if target_path is not None and local is not None and _same(local, target_path):
            yield Candidate(entry.name, "it is the target itself")
            continue
        try:
            draft_info = tokenizer_for(entry, local, online=online)
        except EdgespecError as err:
            yield Candidate(entry.name, f"its tokenizer is unknown here ({err})")
            continue
        yield Candidate(entry.name, compatible(tokens, info, draft_info))


def _same(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return a.resolve() == b.resolve()
    return False


def local_path(entry: Entry) -> Path | None:
    """The entry's verified local file, if it is here (never hashes, never downloads)."""
    from edgespec.models import download as dl

    if isinstance(entry, ModelEntry):
        return dl.verified_path(entry)
    from edgespec.models import hub

    return hub.is_cached(entry.ref)


def tokenizer_for(entry: Entry, local: Path | None = None, *, online: bool = True) -> TokenizerInfo:
    """A catalog model's tokenizer: the catalog's record, else its file here, else its GGUF header
    on the hub (remembered by sha256). :class:`EdgespecError` when none can be had."""
    if entry.tokenizer is not None:
        return entry.tokenizer
    if local is not None:
        try:
            return tokenizer_of(local)[0]
        except (GGUFError, OSError) as err:
            raise EdgespecError(f"cannot read {local}: {err}") from None
    if not isinstance(entry, HubEntry):
        raise EdgespecError("not downloaded and the catalog does not record it")
    if not online:
        raise EdgespecError("not downloaded, and offline")
    from edgespec.models import hub

    remote = hub.remote_file(entry.ref)
    cached = _remembered(remote.sha256)
    if cached is not None:
        return cached
    info = hub.read_remote(entry.ref, remote, lambda fh: read_tokenizer(fh)[0])
    _remember(remote.sha256, info)
    return info


def _memo(sha256: str | None) -> Path | None:
    return cache_dir() / "tokenizers" / f"{sha256}.json" if sha256 else None


def _remembered(sha256: str | None) -> TokenizerInfo | None:
    path = _memo(sha256)
    if path is None:
        return None
    try:
        return TokenizerInfo(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _remember(sha256: str | None, info: TokenizerInfo) -> None:
    path = _memo(sha256)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(info)))
        tmp.replace(path)
    except OSError as err:
        log.debug("cannot remember tokenizer %s: %s", path, err)
