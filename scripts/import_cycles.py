"""Print the import cycles between files of mnnllm_core and the shipped backends.

Builds the file-level import graph with `ast` (nothing is imported) and prints every strongly
connected component of more than one file: a set of files that all reach each other through
imports, which therefore cannot be read, tested or moved one at a time.

An edge goes from a file to the module file it names (`from .a import b` reaches `a/b.py` when
that is a module, else `a/__init__.py`); the parent packages an import runs on the way are not
edges, so a package `__init__` that re-exports its modules does not close a cycle by itself.
By default every import counts, including those inside functions and `TYPE_CHECKING` blocks
(the design's dependencies); `--module-level` keeps only those run when the file is imported.

usage: .venv/bin/python scripts/import_cycles.py [--module-level]
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"mnnllm_core": ROOT / "mnnllm_core", "mnnllm_backends": ROOT / "backends"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (`__init__` names the package)."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_nodes(tree: ast.Module, module_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a file; with `module_level` only those run at import time
    (not inside a function, not under `if TYPE_CHECKING:`)."""
    if not module_level:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))
    return found


def imported_modules(name: str, path: Path, modules: dict[str, Path], module_level: bool) -> set[str]:
    """The modules of `modules` that the file `path` (module `name`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in import_nodes(ast.parse(path.read_text(), str(path)), module_level):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[:len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != name}


def import_graph(module_level: bool) -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules, module_level) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the strongly connected components of `graph`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module-level", action="store_true",
                        help="count only imports run at import time (not in functions or TYPE_CHECKING)")
    args = parser.parse_args(argv)
    graph = import_graph(args.module_level)
    cycles = sorted((c for c in strongly_connected(graph) if len(c) > 1), key=lambda c: (-len(c), c))
    for number, component in enumerate(cycles, 1):
        sys.stdout.write(f"cycle {number}: {len(component)} files\n")
        sys.stdout.writelines(f"  {name}\n" for name in component)
    files = sum(len(c) for c in cycles)
    sys.stdout.write(f"{len(graph)} files, {sum(map(len, graph.values()))} imports; "
                     f"{len(cycles)} cycles of more than one file, {files} files in them\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
