"""The package's layers: what may import what, and no import cycles.

Layers, lowest first (see README, "Layout"):

- ``edgespec.config``, ``edgespec.errors``, ``edgespec._native`` (llama.cpp's libraries without
  llama_cpp): the foundation, importable by everyone;
- ``edgespec.core`` (pure math) and ``edgespec.models`` (files on disk): only the foundation;
- ``edgespec.runtime`` (drives llama.cpp): core, models;
- ``edgespec.bench``: runtime and below;
- faces: ``edgespec.cli``, ``edgespec.server``, ``tui``: anything below. Of the faces, only
  ``edgespec.cli`` imports the others (its subcommands ``serve`` and ``chat``), and a
  subcommand module imports ``edgespec.cli.options``, never ``edgespec.cli.main``.

Imports are read from the source (module level and inside functions alike), so a lazy import
cannot hide a cycle or a wrong-way dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edgespec", "tui")

#: layer -> the layers it may import (besides itself and the foundation)
ALLOWED = {
    "core": set(),
    "models": set(),
    "runtime": {"core", "models"},
    "bench": {"core", "models", "runtime"},
    "server": {"core", "models", "runtime"},
    "tui": {"core", "models", "runtime"},
    "cli": {"core", "models", "runtime", "bench", "server", "tui"},
    "top": {"core", "models", "runtime", "bench", "cli", "server", "tui"},  # __init__, __main__
}
FOUNDATION = {"edgespec.config", "edgespec.errors", "edgespec._native"}


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every edgespec/tui module ``name`` imports, resolved to a module in MODULES."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import mod` imports the submodule pkg.mod when there is one
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    if module in FOUNDATION:
        return "foundation"
    parts = module.split(".")
    if parts[0] == "tui":
        return "tui"
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "top"


def test_the_graph_sees_the_layers():
    """A sanity check of the reader itself, so that the rules below cannot pass vacuously."""
    assert "edgespec.core.sampling" in GRAPH["edgespec.runtime.loop"]
    assert "edgespec.cli.options" in GRAPH["edgespec.cli.bench"]
    assert "edgespec.models.download" in GRAPH["edgespec.models.resolve"]  # a lazy import
    assert {layer(m) for m in MODULES} >= set(ALLOWED) | {"foundation"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_only_down_the_layers(module):
    mine = layer(module)
    allowed = ALLOWED.get(mine, set()) | {mine, "foundation"}
    wrong = sorted(m for m in GRAPH[module] if layer(m) not in allowed)
    assert not wrong, f"{module} ({mine}) imports {wrong}"


def test_subcommands_import_options_not_main():
    for module, imports in GRAPH.items():
        if module.startswith("edgespec.cli.") and module != "edgespec.cli.main":
            assert "edgespec.cli.main" not in imports, module


def test_no_import_cycles():
    """Tarjan's strongly connected components over the import graph: every one a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_core_never_touches_llama_cpp():
    for path in (ROOT / "edgespec" / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "llama_cpp" for n in names), path


def _fresh(code: str, *args: str, timeout: float) -> str:
    """Run ``code`` in a fresh interpreter from the repository root; assert it succeeded and
    return its standard output."""
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_core_imports_without_llama_cpp():
    """Importing every core module loads no llama_cpp (checked in a fresh interpreter)."""
    code = ("import sys, pkgutil, importlib, edgespec.core as c\n"
            "for m in pkgutil.iter_modules(c.__path__): importlib.import_module('edgespec.core.' + m.name)\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] == 'llama_cpp'))")
    assert _fresh(code, timeout=60).strip() == "[]"


def test_every_module_imports_in_a_fresh_interpreter():
    """Each module imports on its own (a cycle that Python can half-resolve would fail here for
    some import order)."""
    names = [m for m in MODULES if not m.endswith("__main__")]
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for k in [k for k in sys.modules if k.split('.')[0] in ('edgespec', 'tui')]:\n"
            "        del sys.modules[k]\n"
            "    importlib.import_module(name)\n")
    _fresh(code, *names, timeout=300)


def test_every_public_name_resolves():
    """``from edgespec import X`` works for every name in ``__all__`` (the lazy map follows the
    modules when they move; a fresh interpreter so nothing is already imported)."""
    code = ("import edgespec\n"
            "for name in edgespec.__all__: getattr(edgespec, name)\n"
            "print(len(edgespec.__all__))")
    assert int(_fresh(code, timeout=120)) >= 10
