"""Turn a model argument (a GGUF path, a hub reference or a catalog name) into a verified local file.

The one place that joins the catalog (what models exist) with the download cache (where their
verified files are), so that neither of those two modules needs the other's caller.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelError
from .catalog import Catalog, HubEntry, hub_ref_of, load_catalog, looks_like_path


def resolve_model(
    name_or_path: str,
    *,
    download: bool = True,
    progress: bool = True,
    catalog: Catalog | None = None,
) -> Path:
    """Turn a model argument into the path of a local GGUF file.

    An existing file is taken as it is. ``OWNER/REPO[:QUANT]`` and ``OWNER/REPO/FILE.gguf`` are
    hub references (:mod:`edgespec.models.hub`: the hub cache, else downloaded and verified; a
    split GGUF gives its first part). Anything else that looks like a path (contains a separator
    or ends in ``.gguf``) is a path: :class:`ModelError` if it is missing or a directory.
    Otherwise it is a catalog name (:class:`ConfigError` if unknown) and the verified file is
    returned: from the cache or a local source, else fetched (:class:`DownloadError` on failure).
    With ``download=False`` nothing is fetched and a model that is not available locally raises
    :class:`ModelError`.
    """
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate.absolute()
    ref = hub_ref_of(name_or_path)
    if ref is not None:
        from . import hub  # deferred: huggingface_hub is only imported when the hub is used

        return hub.resolve(ref, download=download, progress=progress).path
    if looks_like_path(name_or_path):
        if candidate.is_dir():
            raise ModelError(f"model file not found: {name_or_path} is a directory, not a GGUF file")
        raise ModelError(f"model file not found: {name_or_path}")
    from . import download as dl  # deferred: checking a path needs no tqdm

    entry = (catalog or load_catalog()).model(name_or_path)
    if isinstance(entry, HubEntry):
        from . import hub

        return hub.resolve(entry.ref, download=download, progress=progress).path
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
    path-like argument (:class:`ModelError` if missing), a hub reference (its shape only), or a
    known catalog name (:class:`ConfigError` if unknown)."""
    if hub_ref_of(name_or_path) is not None:
        return
    if looks_like_path(name_or_path):
        resolve_model(name_or_path, download=False, catalog=catalog)  # a path: never fetches
    else:
        (catalog or load_catalog()).model(name_or_path)
