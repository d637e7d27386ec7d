"""``edgespec models``: list, fetch and locate the catalog's models."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import ConfigError
from ..models.catalog import Catalog, ModelEntry, load_catalog
from ..models.resolve import resolve_model
from .options import user_errors


def _human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _model_info(catalog: Catalog, entry: ModelEntry) -> dict[str, Any]:
    from ..models import download  # deferred: tqdm is not needed to list or parse

    path = download.verified_path(entry)
    return {
        "name": entry.name,
        "file": entry.file,
        "size": entry.size,
        "sha256": entry.sha256,
        "description": entry.description,
        "cached": path is not None,
        "path": str(path) if path is not None else None,
        "pairs": [{"pair": pair, "role": role} for pair, role in catalog.roles(entry.name)],
    }


def expand_names(catalog: Catalog, names: tuple[str, ...]) -> list[ModelEntry]:
    """Model entries for ``names`` (model or pair names; a pair gives its target and draft), deduplicated."""
    out: dict[str, ModelEntry] = {}
    for name in names:
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
            out.setdefault(model, catalog.models[model])
    return list(out.values())


@click.group("models")
def models() -> None:
    """List, fetch and locate the models in the catalog."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def list_models(as_json: bool) -> None:
    """Show the catalog's models (size, whether cached, pairs) and pairs."""
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
            _human_size(i["size"]),
            "yes" if i["cached"] else "no",
            _roles_text(i["pairs"]),
        )
        for i in infos
    ]
    _table(("MODEL", "SIZE", "CACHED", "PAIRS"), rows)
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
    """Fetch models (or both models of a pair) into the cache and print their paths."""
    catalog = load_catalog()
    for entry in expand_names(catalog, names):
        path = resolve_model(entry.name, download=True, progress=not quiet, catalog=catalog)
        click.echo(str(path))


@models.command("path")
@click.argument("name")
@user_errors
def path(name: str) -> None:
    """Print the path of a cached model (exit 1 if it is not cached; never downloads)."""
    click.echo(str(resolve_model(name, download=False, progress=False)))
