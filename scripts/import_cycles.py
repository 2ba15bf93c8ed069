"""Print the import circles between the files of a package: the strongly connected components
(more than one file) of the file-level import graph, read with `ast` (nothing is imported).

An edge runs from a file to the file an import names: `from .a import b` goes to a/b.py when b is
a submodule, else to a.py (or a/__init__.py). Imports under `if TYPE_CHECKING:` and inside functions
count too, unless --runtime (then only module-level imports outside TYPE_CHECKING). Generated
files (their first line says "automatically generated": the FlatBuffers schema) are left out.
--edges prints, under each circle, the imports that close it.

    python scripts/import_cycles.py [--runtime] [--edges] [package_dir]
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_generated(path: Path) -> bool:
    with open(path, encoding="utf-8") as f:
        return "automatically generated" in f.readline()


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module, runtime: bool) -> list[tuple[ast.stmt, int]]:
    """Import statements; with `runtime`, only module-level ones outside TYPE_CHECKING."""
    found: list[ast.stmt] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If) and runtime and is_type_checking(node.test):
                visit(node.orelse)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and runtime:
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, (ast.stmt, ast.ExceptHandler))])
                if isinstance(node, ast.ExceptHandler):
                    visit(node.body)
    visit(tree.body)
    return found


def graph(root: Path, runtime: bool) -> dict[str, set[str]]:
    files = {module_name(root, p): p for p in root.rglob("*.py") if not is_generated(p)}
    edges: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in imports(ast.parse(path.read_text(), str(path)), runtime):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                stem = ".".join(p for p in (base if node.level else "", node.module or "") if p)
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in files else stem for a in node.names]
            edges[name] |= {t for t in targets if t in files and t != name}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
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
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="mnnllm_core")
    parser.add_argument("--runtime", action="store_true", help="only imports that run when the module loads")
    parser.add_argument("--edges", action="store_true", help="list the imports inside each circle")
    args = parser.parse_args()
    edges = graph(Path(args.package).resolve(), args.runtime)
    found = circles(edges)
    for component in found:
        print(f"{len(component)} files: {' '.join(component)}")
        if args.edges:
            for name in component:
                inside = sorted(edges[name] & set(component))
                print(f"    {name} -> {', '.join(inside)}")
    print(f"{len(found)} import circles")


if __name__ == "__main__":
    main()
