"""Hub references (``OWNER/REPO[:QUANT]``, ``OWNER/REPO/FILE.gguf``) and the choice of GGUF files
in a repository's listing: pure functions, no network.

The rules follow llama.cpp's ``-hf``: the quant is matched case-insensitively against the quant
tag in each file name, ``Q4_K_M`` when none is given (or the repository's only GGUF), and a split
GGUF (``NAME-00001-of-0000N.gguf``) is all of its parts, of which llama.cpp loads the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable, Iterable, Sequence

from ..errors import ModelError

DEFAULT_QUANT = "Q4_K_M"

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REF_RE = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?::(?P<quant>[A-Za-z0-9_.-]+))?$")
_FILE_REF_RE = re.compile(rf"^(?P<repo>{_PART}/{_PART})/(?P<file>(?:{_PART}/)*{_PART}\.gguf)$", re.I)
_URL_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/", "hf://")
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])((?:I|T)?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])", re.I
)


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: a repository and a quant, or a repository and an exact file."""

    repo: str
    quant: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        if self.filename:
            return f"{self.repo}/{self.filename}"
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


@dataclass(frozen=True)
class HubFile:
    """A file in a repository listing: its path in the repository, size and LFS sha256."""

    path: str
    size: int
    sha256: str | None


def parse_ref(text: str) -> HubRef | None:
    """The hub reference ``text`` spells, or ``None`` if it does not have that shape.

    Accepted: ``OWNER/REPO``, ``OWNER/REPO:QUANT``, ``OWNER/REPO/PATH/FILE.gguf``, each optionally
    prefixed by ``hf.co/``, ``huggingface.co/`` or ``hf://``. Paths (``/x``, ``./x``, ``~/x``)
    never are.
    """
    for prefix in _URL_PREFIXES:
        if text.lower().startswith(prefix):
            text = text[len(prefix):]
            break
    m = _FILE_REF_RE.match(text)
    if m:
        return HubRef(repo=m.group("repo"), filename=m.group("file"))
    m = _REF_RE.match(text)
    if m and not text.lower().endswith(".gguf"):
        return HubRef(repo=m.group("repo"), quant=m.group("quant"))
    return None


def quant_of(name: str) -> str | None:
    """The quant tag in a GGUF file name (``Q4_K_M``, ``IQ4_XS``, ``F16``...), upper-cased."""
    stem = _SPLIT_RE.sub("", PurePosixPath(name).name)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.I)
    found = _QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


def split_key(path: str) -> str:
    """The name shared by the parts of a split GGUF, ``NAME-*-of-0000N.gguf`` (the path itself for
    a single file, which may sit beside a split copy of itself)."""
    return _SPLIT_RE.sub(lambda m: f"-*-of-{m.group(2)}.gguf", path)


def _groups(files: Iterable[HubFile]) -> dict[str, list[HubFile]]:
    groups: dict[str, list[HubFile]] = {}
    for f in sorted(files, key=lambda f: f.path):
        groups.setdefault(split_key(f.path), []).append(f)
    return groups


def _complete(repo: str, key: str, parts: list[HubFile]) -> list[HubFile]:
    m = _SPLIT_RE.search(parts[0].path)
    if m is None:
        return parts[:1]
    count = int(m.group(2))
    numbers = sorted(int(_SPLIT_RE.search(p.path).group(1)) for p in parts)  # type: ignore[union-attr]
    if numbers != list(range(1, count + 1)):
        raise ModelError(f"split GGUF {key} in {repo} is incomplete: has parts {numbers} of {count}")
    return parts


def pick_files(ref: HubRef, listing: Sequence[HubFile], *, where: str = "",
               on_choice: Callable[[str], object] | None = None) -> list[HubFile]:
    """The GGUF file(s) ``ref`` names in ``listing``: one file, or every part of a split GGUF in
    order (the first is the one to load). :class:`ModelError` saying why when there is none.
    When several carry the quant, ``on_choice`` hears which was taken."""
    at = f" {where}" if where else ""
    ggufs = [f for f in listing if f.path.lower().endswith(".gguf")]
    if not ggufs:
        raise ModelError(f"{ref.repo}{at} has no GGUF file")
    if ref.filename:
        exact = [f for f in ggufs if f.path == ref.filename] or [
            f for f in ggufs if f.path.lower() == ref.filename.lower()
        ]
        if not exact:
            names = ", ".join(f.path for f in ggufs[:8]) + (" ..." if len(ggufs) > 8 else "")
            raise ModelError(f"{ref.repo}{at} has no file {ref.filename}; its GGUF files: {names}")
        key = split_key(exact[0].path)
        return _complete(ref.repo, key, _groups(ggufs)[key])
    # Vision projectors ride along in many repositories; they are never the language model.
    groups = {k: v for k, v in _groups(ggufs).items() if "mmproj" not in PurePosixPath(k).name.lower()}
    wanted = (ref.quant or DEFAULT_QUANT).upper()
    matches = [k for k in groups if quant_of(k) == wanted]
    if not matches and ref.quant is None and len(groups) == 1:
        matches = list(groups)
    if not matches:
        quants = sorted({quant_of(k) or PurePosixPath(k).name for k in groups})
        hint = f"; pick one with {ref.repo}:QUANT" if quants else ""
        raise ModelError(f"{ref.repo}{at} has no {wanted} GGUF; it has: {', '.join(quants) or 'none'}{hint}")
    if len(matches) > 1:
        # Repositories often carry a quant twice (one file and a split copy, or a variant):
        # one file over parts, then the shallowest and shortest name; the caller says so.
        matches.sort(key=lambda k: (len(groups[k]) > 1, k.count("/"), len(k), k))
        if on_choice is not None:
            on_choice(f"{ref.repo}{at} has {len(matches)} {wanted} GGUFs: {', '.join(matches)}; "
                      f"took {matches[0]} (name another as {ref.repo}/FILE.gguf)")
    return _complete(ref.repo, matches[0], groups[matches[0]])
