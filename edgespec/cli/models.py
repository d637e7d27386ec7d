"""``edgespec models``: list, fetch and locate models (catalog names, hub references, pairs), and
list the drafts that fit a target."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import ConfigError
from ..models.catalog import Catalog, Entry, HubEntry, hub_ref_of, load_catalog
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
    }


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
    """Show the catalog's models (where from, size, whether cached, pairs) and pairs."""
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
            _roles_text(i["pairs"]),
        )
        for i in infos
    ]
    _table(("MODEL", "SOURCE", "SIZE", "CACHED", "PAIRS"), rows)
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


@models.command("drafts")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def drafts(target: str, as_json: bool) -> None:
    """List the catalog drafts that can speculate for TARGET, and why the others cannot.

    TARGET is a catalog name, a hub reference or a GGUF path; it is fetched if it is not here
    (its tokenizer is read from its GGUF header). The first compatible draft is the one
    `--drafter auto|model|hybrid` picks when no --draft is given.
    """
    from ..models.drafts import judge_all

    catalog = load_catalog()
    target_path = resolve_model(target, download=True, progress=not as_json, catalog=catalog)
    choice, rows = judge_all(target, target_path, catalog=catalog)
    if as_json:
        click.echo(json.dumps({"target": target, "path": str(target_path), "picked": choice.draft,
                               "reason": choice.reason,
                               "drafts": [{"name": n, "compatible": p is None, "why_not": p} for n, p in rows]},
                              indent=2))
        return
    _table(("DRAFT", "COMPATIBLE", "WHY NOT"),
           [(n, "yes" if p is None else "no", p or "") for n, p in rows])
    click.echo()
    click.echo(f"picked: {choice.draft or 'none (lookup drafting only)'}: {choice.reason}")
