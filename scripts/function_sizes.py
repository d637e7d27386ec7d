"""Function lengths and parameter counts of Python modules, as a table: the measure behind
"each step short enough to read on one screen" in restructurings.

    python scripts/function_sizes.py edgespec/runtime/loop.py [--rev REV] [--top N]

``--rev`` reads the files as a git revision has them (``git show REV:PATH``)."""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path


def sizes(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, lines, parameters without self/cls) of every function, longest first."""
    out = []

    def walk(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                names = [n for n in names if n not in ("self", "cls")]
                n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
                out.append((prefix + child.name, child.end_lineno - child.lineno + 1, n))
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(source))
    return sorted(out, key=lambda r: -r[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--rev", default=None)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    print("| file | lines | functions | longest (lines) | most parameters |")
    print("|---|---|---|---|---|")
    for path in args.paths:
        if args.rev:
            text = subprocess.run(["git", "show", f"{args.rev}:{path}"], capture_output=True,
                                  text=True, check=True).stdout
        else:
            text = Path(path).read_text()
        rows = sizes(text)
        top = ", ".join(f"{n} {l}" for n, l, _ in rows[: args.top])
        most = ", ".join(f"{n} {p}" for n, _, p in sorted(rows, key=lambda r: -r[2])[:3])
        print(f"| {path} | {len(text.splitlines())} | {len(rows)} | {top} | {most} |")


if __name__ == "__main__":
    main()
