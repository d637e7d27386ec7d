"""Turn a model argument (a catalog name or a GGUF path) into a verified local file.

The one place that joins the catalog (what models exist) with the download cache (where their
verified files are), so that neither of those two modules needs the other's caller.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelError
from .catalog import Catalog, load_catalog, looks_like_path


def resolve_model(
    name_or_path: str,
    *,
    download: bool = True,
    progress: bool = True,
    catalog: Catalog | None = None,
) -> Path:
    """Turn a model argument into the path of a local GGUF file.

    An existing file, or anything that looks like a path (contains a separator or ends in
    ``.gguf``), is taken as a path: :class:`ModelError` if it is missing or a directory.
    Otherwise it is a catalog name (:class:`ConfigError` if unknown) and the verified file is
    returned: from the cache or a local source, else fetched (:class:`DownloadError` on failure).
    With ``download=False`` nothing is fetched and a model that is not available locally raises
    :class:`ModelError`.
    """
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate.absolute()
    if looks_like_path(name_or_path):
        if candidate.is_dir():
            raise ModelError(f"model file not found: {name_or_path} is a directory, not a GGUF file")
        raise ModelError(f"model file not found: {name_or_path}")
    from . import download as dl  # deferred: checking a path needs no tqdm

    entry = (catalog or load_catalog()).model(name_or_path)
    if download:
        return dl.ensure_model(entry, progress=progress)
    found = dl.find_verified(entry, progress=progress)
    if found is None:
        raise ModelError(
            f"model '{entry.name}' is not cached (expected {dl.cache_file(entry)}); "
            f"fetch it with: edgespec models pull {entry.name}"
        )
    return found


def check_model_argument(name_or_path: str, *, catalog: Catalog | None = None) -> None:
    """Check a model argument without loading or fetching anything: an existing file, or a
    path-like argument (:class:`ModelError` if missing), or a known catalog name
    (:class:`ConfigError` if unknown)."""
    if Path(name_or_path).expanduser().is_file() or looks_like_path(name_or_path):
        resolve_model(name_or_path, download=False, catalog=catalog)  # a path: never fetches
    else:
        (catalog or load_catalog()).model(name_or_path)
