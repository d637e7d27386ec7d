"""Models on the Hugging Face hub by reference: list the repository, pick the GGUF (see
:mod:`edgespec.models.hubref`), download it into the hub cache with ``huggingface-hub`` and check
each file's size and the sha256 the hub reports for it.

Files land in the standard hub cache (``HF_HUB_CACHE``, ``HF_HOME``), shared with every other
tool that uses it; a split GGUF's parts sit side by side in one snapshot folder, as llama.cpp
wants them. ``HF_TOKEN`` opens gated repositories, ``HF_ENDPOINT`` points at a mirror, and
``HF_HUB_OFFLINE=1`` (or an unreachable hub) resolves from what is cached. A verified file is
remembered by a marker (size, mtime), so it is hashed once.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, TypeVar

from ..errors import DownloadError, EdgespecError, ModelError
from . import download as dl
from .hubref import HubFile, HubRef, pick_files

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
T = TypeVar("T")


@dataclass(frozen=True)
class HubSettings:
    """The hub's environment, read when used (not when ``huggingface_hub`` was imported)."""

    endpoint: str
    token: str | None
    offline: bool
    cache_dir: Path
    timeout: float

    @classmethod
    def from_env(cls) -> "HubSettings":
        env = os.environ
        if env.get("HF_HUB_CACHE"):
            cache = Path(env["HF_HUB_CACHE"]).expanduser()
        else:
            home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
            cache = Path(home).expanduser() / "hub"
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
            token=env.get("HF_TOKEN") or None,
            offline=dl._env_true("HF_HUB_OFFLINE") or dl._env_true("EDGESPEC_NO_HF"),
            cache_dir=cache,
            timeout=dl._hf_timeout(),
        )


@dataclass(frozen=True)
class Resolved:
    """A hub reference resolved to local files (every part of a split GGUF, in order)."""

    ref: HubRef
    files: tuple[HubFile, ...]
    paths: tuple[Path, ...]

    @property
    def path(self) -> Path:
        """The file to load (the first part of a split GGUF)."""
        return self.paths[0]


# --------------------------------------------------------------------------- listing

_PROBES: dict[str, tuple[float, str | None]] = {}
_PROBE_TTL_S = 30.0


def probe(settings: HubSettings) -> str | None:
    """Why the hub cannot be reached, or ``None``; remembered for a while, so that judging several
    drafts against an unreachable hub costs one failed connection, not one each."""
    now = time.monotonic()
    seen = _PROBES.get(settings.endpoint)
    if seen is not None and now - seen[0] < _PROBE_TTL_S:
        return seen[1]
    why = dl.probe_hub(settings.endpoint, settings.timeout)
    _PROBES[settings.endpoint] = (now, why)
    return why


def list_remote(ref: HubRef, settings: HubSettings) -> list[HubFile]:
    """The repository's files with sizes and LFS sha256 (:class:`DownloadError`/:class:`ModelError`)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=settings.endpoint, token=settings.token)
    try:
        entries = list(api.list_repo_tree(ref.repo, recursive=True))
    except Exception as err:  # the hub client raises many kinds
        raise _hub_error(ref, err, settings) from None
    out = []
    for e in entries:
        if getattr(e, "size", None) is None:  # a folder
            continue
        lfs = getattr(e, "lfs", None)
        out.append(HubFile(path=e.path, size=int(e.size), sha256=getattr(lfs, "sha256", None)))
    return out


def _repo_dir(repo: str, settings: HubSettings) -> Path:
    return settings.cache_dir / ("models--" + repo.replace("/", "--"))


def list_cached(ref: HubRef, settings: HubSettings) -> dict[str, tuple[HubFile, Path]]:
    """The repository's files in the hub cache, each with its local path, taken from the newest
    snapshot that has it (``refs/main`` first). The blob's name, the file's etag, is its sha256
    for LFS files."""
    repo_dir = _repo_dir(ref.repo, settings)
    snapshots: list[Path] = []
    with contextlib.suppress(OSError):
        main = (repo_dir / "refs" / "main").read_text().strip()
        snapshots.append(repo_dir / "snapshots" / main)
    with contextlib.suppress(OSError):
        others = sorted((repo_dir / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        snapshots += [p for p in others if p not in snapshots]
    seen: dict[str, tuple[HubFile, Path]] = {}
    for snap in snapshots:
        for path in sorted(snap.rglob("*")):
            rel = path.relative_to(snap).as_posix()
            if rel in seen or not path.is_file():
                continue
            blob = Path(os.path.realpath(path)).name
            seen[rel] = (HubFile(path=rel, size=path.stat().st_size,
                                 sha256=blob if _SHA256_RE.match(blob) else None), path)
    return seen


# --------------------------------------------------------------------------- resolving


def resolve(ref: HubRef, *, download: bool = True, progress: bool = True,
            settings: HubSettings | None = None) -> Resolved:
    """Local, verified files for ``ref``: from the hub cache, else downloaded (``download=True``).

    Offline (``HF_HUB_OFFLINE=1``) or with the hub unreachable, only the cache is used. Raises
    :class:`ModelError` (no such file or quant, not cached) or :class:`DownloadError` (the hub
    refused or failed, a download did not verify); the message is one line.
    """
    settings = settings or HubSettings.from_env()
    if settings.offline or not download:
        return _from_cache(ref, settings, progress, why="HF_HUB_OFFLINE is set" if settings.offline
                           else f"fetch it with: edgespec models pull {ref}")
    unreachable = probe(settings)
    if unreachable is not None:
        try:
            found = _from_cache(ref, settings, progress, why=unreachable)
        except ModelError:
            raise DownloadError(f"cannot fetch {ref}: {unreachable}") from None
        dl._note(progress, f"{unreachable}; using the cached {ref}")
        return found
    files = pick_files(ref, list_remote(ref, settings), where="on the hub",
                       on_choice=lambda msg: dl._note(progress, msg))
    paths = tuple(_fetch(ref, f, settings, progress) for f in files)
    return Resolved(ref=ref, files=tuple(files), paths=paths)


def _from_cache(ref: HubRef, settings: HubSettings, progress: bool, *, why: str) -> Resolved:
    cached = list_cached(ref, settings)
    if not cached:
        raise ModelError(f"{ref} is not in the hub cache ({settings.cache_dir}); {why}")
    try:
        files = pick_files(ref, [f for f, _ in cached.values()], where="in the hub cache")
    except ModelError as err:
        raise ModelError(f"{err} ({why})") from None
    paths = tuple(cached[f.path][1] for f in files)
    for f, path in zip(files, paths):
        _verify(ref, f, path, progress)
    return Resolved(ref=ref, files=tuple(files), paths=paths)


def _fetch(ref: HubRef, f: HubFile, settings: HubSettings, progress: bool) -> Path:
    """Download one file into the hub cache (``huggingface-hub`` resumes a dropped transfer with a
    range request) and verify it."""
    from huggingface_hub import hf_hub_download

    kwargs: dict[str, Any] = {"cache_dir": settings.cache_dir, "endpoint": settings.endpoint,
                              "token": settings.token, "etag_timeout": settings.timeout}
    if not progress:
        kwargs["tqdm_class"] = dl._SilentTqdm
    try:
        path = Path(hf_hub_download(ref.repo, f.path, **kwargs))
    except OSError as err:
        if err.errno in dl._FATAL_WRITE_ERRNOS:
            raise DownloadError(f"cannot store {f.path} in {settings.cache_dir}: {err.strerror}") from None
        raise _hub_error(ref, err, settings) from None
    except Exception as err:
        raise _hub_error(ref, err, settings) from None
    _verify(ref, f, path, progress)
    return path


def _verify(ref: HubRef, f: HubFile, path: Path, progress: bool) -> None:
    """Check ``path`` against the size and sha256 the hub reported; a file that fails is removed
    from the cache (blob and link) so that nothing unverified stays."""
    size = path.stat().st_size
    problem = None
    if size != f.size:
        problem = f"wrong size ({size} bytes, the hub says {f.size})"
    elif f.sha256 is None:
        return  # not an LFS file: the hub reports no sha256 to check it against
    elif not dl.has_valid_marker(path, f.sha256):
        with dl._bar(progress, size, f"verifying {Path(f.path).name}") as bar:
            digest = dl.sha256_file(path, on_progress=bar.update)
        if digest == f.sha256:
            dl.write_marker(path, digest)
        else:
            problem = f"sha256 mismatch (got {digest[:16]}..., the hub says {f.sha256[:16]}...)"
    if problem is not None:
        blob = Path(os.path.realpath(path))
        for p in (path, blob, dl.marker_for(path)):
            with contextlib.suppress(OSError):
                p.unlink()
        raise DownloadError(f"{ref}: {f.path} failed verification: {problem}; removed it from the cache")


# --------------------------------------------------------------------------- errors


def _hub_error(ref: HubRef, err: BaseException, settings: HubSettings) -> Exception:
    """One line for what the hub client raised."""
    from huggingface_hub import errors as hf_errors

    if isinstance(err, hf_errors.GatedRepoError):
        if settings.token:
            return DownloadError(f"{ref.repo} is gated and the token in HF_TOKEN has no access: "
                                 "accept its terms on its hub page with that account")
        return DownloadError(f"{ref.repo} is gated: accept its terms on its hub page and set HF_TOKEN "
                             "to an access token of that account")
    if isinstance(err, hf_errors.RepositoryNotFoundError):
        hint = "" if settings.token else " (a private repository needs HF_TOKEN)"
        return ModelError(f"repository {ref.repo} not found on the hub ({settings.endpoint}){hint}")
    if isinstance(err, hf_errors.RevisionNotFoundError):
        return ModelError(f"{ref.repo}: revision not found on the hub")
    if isinstance(err, hf_errors.EntryNotFoundError):
        return ModelError(f"{ref}: file not found on the hub")
    if isinstance(err, hf_errors.HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", "?")
        return DownloadError(f"the hub answered HTTP {status} for {ref}: {dl._one_line(err)}")
    if isinstance(err, hf_errors.OfflineModeIsEnabled):
        return ModelError(f"{ref} is not cached and HF_HUB_OFFLINE is set")
    return DownloadError(f"cannot fetch {ref} from {settings.endpoint}: {dl._one_line(err)}")


def remote_file(ref: HubRef, settings: HubSettings | None = None) -> HubFile:
    """The file ``ref`` names on the hub (the first part of a split GGUF), from its listing."""
    settings = settings or HubSettings.from_env()
    if settings.offline:
        raise ModelError(f"{ref}: HF_HUB_OFFLINE is set")
    unreachable = probe(settings)
    if unreachable is not None:
        raise DownloadError(f"cannot list {ref}: {unreachable}")
    return pick_files(ref, list_remote(ref, settings), where="on the hub")[0]


def read_remote(ref: HubRef, f: HubFile, read: Callable[[BinaryIO], T],
                settings: HubSettings | None = None) -> T:
    """``read(fh)`` over the hub file ``f`` opened for ranged reads: only the bytes read travel."""
    from huggingface_hub import HfFileSystem

    settings = settings or HubSettings.from_env()
    fs = HfFileSystem(endpoint=settings.endpoint, token=settings.token, skip_instance_cache=True)
    try:
        with fs.open(f"{ref.repo}/{f.path}", "rb", block_size=1 << 20) as fh:
            return read(fh)
    except EdgespecError:
        raise
    except ValueError as err:  # the reader's own complaint (not a GGUF...)
        raise ModelError(f"{ref}: {f.path}: {err}") from None
    except Exception as err:
        raise _hub_error(ref, err, settings) from None


def is_cached(ref: HubRef, settings: HubSettings | None = None) -> Path | None:
    """The local file for ``ref`` if the hub cache holds it and a marker vouches for it; never
    hashes, never touches the network (for listings)."""
    settings = settings or HubSettings.from_env()
    cached = list_cached(ref, settings)
    try:
        files = pick_files(ref, [f for f, _ in cached.values()])
    except ModelError:
        return None
    paths = [cached[f.path][1] for f in files]
    for f, p in zip(files, paths):
        if f.sha256 is not None and not dl.has_valid_marker(p, f.sha256):
            return None
    return paths[0]
