"""The project's Python modules and the imports between them, read from the source (ast), for the tests that hold
the code's shape (test_structure.py) and its single definitions (test_one_source.py)."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sdcguard", "fleet_scan", "scripts", "benchmarks")
"""The trees whose modules form the import graph (tests stand outside it)."""
EXTENSIONS = {
    "sdcguard._fpcore": ROOT / "sdcguard" / "_fpcore.c",
    "sdcguard.training.checksums._core": ROOT / "sdcguard" / "training" / "checksums" / "_core.c",
}
"""Modules built from C at install: importable, but not a ``.py`` file."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @functools.cached_property
    def tree(self) -> ast.Module:
        return ast.parse(self.path.read_text(), str(self.path))


@functools.cache
def modules() -> dict[str, Module]:
    """Every module of :data:`PACKAGES`, by dotted name (a package by its own name)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = Module(".".join(parts), path)
    return out


def _known(name: str) -> bool:
    return name in modules() or name in EXTENSIONS


def imports(module: Module) -> set[str]:
    """The project modules ``module`` imports, anywhere in it: at the top, inside functions, under
    ``TYPE_CHECKING``. ``from pkg import name`` is an import of the module ``pkg.name`` when there is one, else of
    ``pkg`` itself."""
    found: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.name.split(".")[: len(module.name.split(".")) - node.level + module.is_package]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if _known(f"{source}.{a.name}") else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and not _known(target):  # `import a.b.c` of a module a.b with an attribute c
                target = target.rpartition(".")[0]
            if target and target != module.name:
                found.add(target)
    return found


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imports(m)) for name, m in modules().items()}


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def library() -> list[Module]:
    """The modules of the library and the scanner (``sdcguard/``, ``fleet_scan/``)."""
    return [m for name, m in modules().items() if name.split(".")[0] in ("sdcguard", "fleet_scan")]


def docstring_nodes(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (of the module, a class, a function, or an attribute)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            value = stmt.value if isinstance(stmt, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.add(id(value))
    return out
