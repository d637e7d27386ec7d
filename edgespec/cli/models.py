"""``edgespec models``: list, fetch and locate models (catalog names, hub references, pairs), say
what one is (architecture, hybrid or not, MTP layers), and list the drafts that fit a target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, ModelError
from ..models.catalog import Catalog, Entry, HubEntry, hub_ref_of, load_catalog
from ..models.gguf_meta import ArchInfo, GGUFError, arch_of, arch_kind
from ..models.resolve import resolve_model
from .options import user_errors


def _human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _model_info(catalog: Catalog, entry: Entry) -> dict[str, Any]:
    from ..models.drafts import local_path  # deferred: tqdm is not needed to list or parse

    path = local_path(entry)
    if isinstance(entry, HubEntry):
        source = {"repo": entry.repo, "quant": entry.quant, "file": None, "size": None, "sha256": None}
        if path is not None:
            source.update(file=path.name, size=path.stat().st_size)
    else:
        source = {"repo": None, "quant": None, "file": entry.file, "size": entry.size, "sha256": entry.sha256}
    return {
        "name": entry.name,
        **source,
        "params": entry.params,
        "description": entry.description,
        "cached": path is not None,
        "path": str(path) if path is not None else None,
        "pairs": [{"pair": pair, "role": role} for pair, role in catalog.roles(entry.name)],
        **_layers(entry, path),
    }


def _arch_here(path: Path | None) -> ArchInfo | None:
    """What the GGUF header at ``path`` says of the model; None if there is no file or no header."""
    if path is None:
        return None
    try:
        return arch_of(path)
    except (GGUFError, OSError):
        return None


def _layers(entry: Entry | None, path: Path | None) -> dict[str, Any]:
    """The model's architecture, its kind (hybrid, recurrent, attention) and MTP layers: as its
    file here says, else as the catalog records (``mtp_layers`` then unknown: None)."""
    info = _arch_here(path)
    if info is not None:
        return {"arch": info.arch or None, "kind": info.kind, "hybrid": info.hybrid,
                "mtp": info.mtp_layers > 0, "mtp_layers": info.mtp_layers, "arch_from": "file"}
    arch = entry.arch if entry is not None else None
    mtp = entry.mtp if entry is not None else None
    kind = arch_kind(arch) if arch else None
    return {"arch": arch, "kind": kind, "hybrid": None if kind is None else kind == "hybrid",
            "mtp": mtp, "mtp_layers": None,
            "arch_from": "catalog" if arch is not None or mtp is not None else None}


def _layers_text(info: dict[str, Any]) -> str:
    """``qwen35, hybrid, MTP layers: 1`` (``MTP`` alone when the count is not known); "" when
    nothing is known."""
    if info["arch"] is None and not info["mtp"]:
        return ""
    parts = [info["arch"] or "unknown architecture"]
    if info["kind"] not in (None, "attention"):
        parts.append(info["kind"])
    if info["mtp_layers"]:
        parts.append(f"MTP layers: {info['mtp_layers']}")
    elif info["mtp"]:
        parts.append("MTP")
    return ", ".join(parts)


def expand_names(catalog: Catalog, names: tuple[str, ...]) -> list[str]:
    """Model arguments for ``names`` (pair names give their target and draft; catalog names, hub
    references and paths stand for themselves), deduplicated."""
    out: dict[str, None] = {}
    for name in names:
        if hub_ref_of(name) is not None:
            out.setdefault(name)
            continue
        if name in catalog.pairs:
            pair = catalog.pairs[name]
            wanted = [pair.target, pair.draft]
        elif name in catalog.models:
            wanted = [name]
        else:
            raise ConfigError(
                f"unknown model or pair '{name}'; models: {', '.join(sorted(catalog.models))}; "
                f"pairs: {', '.join(sorted(catalog.pairs))}"
            )
        for model in wanted:
            out.setdefault(model)
    return list(out)


@click.group("models")
def models() -> None:
    """List, fetch and locate the models in the catalog."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def list_models(as_json: bool) -> None:
    """Show the catalog's models (where from, size, whether cached, architecture, pairs) and pairs.

    ARCH is what a cached file's GGUF header says (hybrid: recurrent layers beside attention;
    MTP layers: multi-token-prediction layers), else what the catalog records.
    """
    catalog = load_catalog()
    infos = [_model_info(catalog, entry) for entry in catalog.models.values()]
    if as_json:
        pairs = [
            {"name": p.name, "target": p.target, "draft": p.draft, "description": p.description}
            for p in catalog.pairs.values()
        ]
        click.echo(json.dumps({"catalog": str(catalog.path), "models": infos, "pairs": pairs}, indent=2))
        return
    rows = [
        (
            i["name"],
            f"{i['repo']}:{i['quant']}" if i["repo"] else "pinned",
            _human_size(i["size"]) if i["size"] else "-",
            "yes" if i["cached"] else "no",
            _layers_text(i),
            _roles_text(i["pairs"]),
        )
        for i in infos
    ]
    _table(("MODEL", "SOURCE", "SIZE", "CACHED", "ARCH", "PAIRS"), rows)
    click.echo()
    _table(("PAIR", "TARGET", "DRAFT"), [(p.name, p.target, p.draft) for p in catalog.pairs.values()])


def _roles_text(roles: list[dict[str, str]]) -> str:
    """``default (target), tiny (target+draft)``."""
    by_pair: dict[str, list[str]] = {}
    for r in roles:
        by_pair.setdefault(r["pair"], []).append(r["role"])
    return ", ".join(f"{pair} ({'+'.join(rs)})" for pair, rs in by_pair.items()) or "-"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())


@models.command("pull")
@click.argument("names", nargs=-1, required=True)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@user_errors
def pull(names: tuple[str, ...], quiet: bool) -> None:
    """Fetch models into the cache and print their paths.

    NAMES are catalog models, pairs (both their models), or hub references:
    OWNER/REPO[:QUANT] (Q4_K_M by default) or OWNER/REPO/FILE.gguf.
    """
    catalog = load_catalog()
    for name in expand_names(catalog, names):
        path = resolve_model(name, download=True, progress=not quiet, catalog=catalog)
        click.echo(str(path))


@models.command("path")
@click.argument("name")
@user_errors
def path(name: str) -> None:
    """Print the path of a cached model (exit 1 if it is not cached; never downloads)."""
    click.echo(str(resolve_model(name, download=False, progress=False)))


@models.command("info")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def info(name: str, as_json: bool) -> None:
    """Say what a model is: its architecture, whether that is hybrid (recurrent layers beside
    attention), its MTP (multi-token-prediction) layers, and where it is. Never downloads.

    NAME is a catalog model, a hub reference or a GGUF path. A file that is here is read (its
    GGUF header); otherwise the catalog's record is shown.
    """
    from ..models.drafts import find_entry, local_path  # deferred: as in _model_info

    catalog = load_catalog()
    ref = hub_ref_of(name)
    if ref is not None:
        entry: Entry | None = find_entry(ref, catalog)
        path = None
        try:
            path = resolve_model(name, download=False, progress=False, catalog=catalog)
        except ModelError:
            pass
    elif name in catalog.models and not Path(name).expanduser().is_file():
        entry = catalog.model(name)
        path = local_path(entry)
    else:
        path = resolve_model(name, download=False, progress=False, catalog=catalog)
        entry = None
    layers = _layers(entry, path)
    out = {"model": name, "catalog": entry.name if entry is not None else None,
           "path": str(path) if path is not None else None, **layers,
           "pairs": [{"pair": p, "role": r} for p, r in catalog.roles(entry.name)] if entry else []}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    rows = [("model", name)]
    if entry is not None and entry.name != name:
        rows.append(("catalog", entry.name))
    rows.append(("path", out["path"] or "not here"))
    arch = layers["arch"] or "unknown"
    if layers["kind"] == "hybrid":
        arch += " (hybrid: recurrent layers beside attention)"
    elif layers["kind"] == "recurrent":
        arch += " (recurrent: no attention layers)"
    rows.append(("architecture", arch))
    if layers["mtp_layers"] is not None:
        rows.append(("MTP layers", str(layers["mtp_layers"])))
    elif layers["mtp"] is not None:
        rows.append(("MTP layers", f"{'yes' if layers['mtp'] else 'none'} (the catalog's record)"))
    else:
        rows.append(("MTP layers", "unknown"))
    if layers["arch_from"]:
        rows.append(("read from", "its GGUF header" if layers["arch_from"] == "file" else "the catalog"))
    if out["pairs"]:
        rows.append(("pairs", _roles_text(out["pairs"])))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key + ':':<{width + 1}} {value}")


@models.command("drafts")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def drafts(target: str, as_json: bool) -> None:
    """List the catalog drafts that can speculate for TARGET, and why the others cannot.

    TARGET is a catalog name, a hub reference or a GGUF path; it is fetched if it is not here
    (its tokenizer is read from its GGUF header). The first compatible draft is the one
    `--drafter auto|model|hybrid` picks when no --draft is given. A hybrid target (recurrent
    layers beside attention) is said to be one, and a target that carries MTP layers is told to
    be able to draft with those (`--drafter mtp`, no second model) instead.
    """
    from ..models.drafts import judge_all, mtp_note

    catalog = load_catalog()
    target_path = resolve_model(target, download=True, progress=not as_json, catalog=catalog)
    choice, rows = judge_all(target, target_path, catalog=catalog)
    arch = _arch_here(target_path)
    note = mtp_note(target, arch, choice) if arch is not None else None
    if as_json:
        click.echo(json.dumps({"target": target, "path": str(target_path), "picked": choice.draft,
                               "reason": choice.reason,
                               "drafts": [{"name": n, "compatible": p is None, "why_not": p} for n, p in rows],
                               "arch": (arch.arch or None) if arch else None,
                               "kind": arch.kind if arch else None,
                               "mtp_layers": arch.mtp_layers if arch else None,
                               "mtp_note": note},
                              indent=2))
        return
    _table(("DRAFT", "COMPATIBLE", "WHY NOT"),
           [(n, "yes" if p is None else "no", p or "") for n, p in rows])
    click.echo()
    click.echo(f"picked: {choice.draft or 'none (lookup drafting only)'}: {choice.reason}")
    # Only for what needs saying (a hybrid or recurrent target, MTP layers): a plain
    # attention model's report ends at the pick, as it always did.
    if arch is not None and (arch.kind != "attention" or arch.mtp_layers):
        click.echo(f"target: {arch.describe()}")
    if note is not None:
        click.echo(f"mtp: {note}")
