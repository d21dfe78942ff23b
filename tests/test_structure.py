"""The shape of the code, read from the code: the import graph has no circle and only goes down the layers (between
the wings and, inside the training and fleet wings, between their folders), no folder of the library holds more
than 15 modules, no module is over 500 lines (the fleet store's over 400), no function over 80, no class is only the
base of one class in another module, the fleet store's rooms import one way, and docstrings name modules that exist.

The layers, bottom up (a module imports its own layer's modules and the layers below, never above):

0. the core: ``sdcguard``'s top-level modules (records, errors, devices, durations, resources, fingerprints, and
   the few shared pieces listed in :data:`CORE`), and the ``sdcguard`` package itself, whose lazy table of public
   names imports nothing when ``sdcguard`` is imported;
1. the wings: ``training`` (with its public faces ``sdcguard.adapters`` and ``sdcguard.checkpoint``), ``fleet``,
   ``golden``, ``inject``; a wing imports no other wing (the exceptions below say why);
2. ``fleet_scan``, the scanner job;
3. ``sdcguard.cli`` (and ``python -m sdcguard``);
4. ``scripts``, ``benchmarks`` and :mod:`sdcguard.testing` (the local rank runner that tests, benchmarks and the
   GPU check share: no module of the library imports it).

Inside a wing, its folders are layered too (:data:`FOLDER_LAYERS`): a module imports modules of its own folder
layer and below.

Imports anywhere count: at the top, inside functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re

import pytest

from tests._code import ROOT, cycles, graph, library, modules

CORE = {
    "records",
    "errors",
    "devices",
    "durations",
    "resources",
    "fingerprints",
    "exit_codes",
    "contract",
    "entry",
    "fp8",
    "logs",
    "medians",
    "kernels",
    "cpu_time",
    "_fpcore",
}
"""The core's top-level modules under ``sdcguard``: the six of the design, plus ``exit_codes`` and ``entry`` (the
exit codes, and the one-line error rule every command line shares), ``contract`` (the training job's exit-code
contract and verdict file, which ``sdcguard launch`` reads without torch), ``fp8`` (the e4m3 table of the golden suite
and the injector), ``kernels`` (the CUDA loader of the golden suite and the fingerprint), ``cpu_time`` (the slow
drills' CPU burning, used by the golden backend and the injector), ``logs`` (the ``sdcguard`` logger) and
``_fpcore`` (the fingerprint's C engine)."""
WINGS = {
    "training": "training",
    "adapters": "training",
    "checkpoint": "training",
    "fleet": "fleet",
    "golden": "golden",
    "inject": "inject",
}
"""``sdcguard.<name>`` -> the wing it belongs to (the adapters and ``sdcguard.checkpoint`` are the training side's
documented import paths)."""

CROSSING_ALLOWED = {
    (
        "sdcguard.checkpoint.dcp",
        "sdcguard.fleet.store.spool",
    ): "DESIGN.md: training reads its verified checkpoints through the store's public API (a drill: its drill store)",
    (
        "sdcguard.training.response",
        "sdcguard.fleet.store.spool",
    ): "DESIGN.md: training records incidents through the store's public API (a server store: with its spool)",
    (
        "sdcguard.checkpoint.asynchronous",
        "sdcguard.fleet.store.spool",
    ): "DESIGN.md: checkpoints are recorded the same way, through the store's public API",
}
"""Imports from one wing into another, each with its reason: nothing else may cross."""

FOLDER_LAYERS: dict[str, list[set[str]]] = {
    "sdcguard.training": [
        {"digest", "comm", "identity", "mesh"},
        {"hooks"},
        {"replay"},
        {"verdicts", "step_check"},
        {"checksums", "rounds"},
        {"config", "replica", "response", "timing", "notices", "recovery", "placement", "wiring", "loop", "local"},
        {"guard", "rejoin"},
    ],
    "sdcguard.fleet": [
        {"store"},
        {"rates", "slow", "slow_fleet", "breaker", "actions", "policy", "merge", "dcgm", "nvml"},
        {"report", "plan"},
    ],
}
"""Per wing, its modules and folders (the name under the wing) from the bottom layer up: the store below what reads
it; in training, the digest and the communication below the hooks, replay, verdicts, the two kinds of check that
use them (and the shape they share, :mod:`sdcguard.training.step_check`), then the guard's own parts and the
guard."""
MAX_FOLDER_MODULES = 15

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
STORE = "sdcguard/fleet/store/"
MAX_STORE_MODULE_LINES = 400
"""The fleet store's modules are smaller still: a job, the core, a backend, a kind of migration each."""
SIZE_EXCEPTIONS: dict[str, str] = {}
"""``path`` or ``path:function`` -> why it may be longer (none today; ``sdcguard/training/checksum*.py`` and the
store's files, being changed elsewhere, were checked and are within the limits)."""


def layer(name: str) -> tuple[int, str]:
    """``(rank, group)`` of a module; a module of an unknown place fails the test that asks."""
    parts = name.split(".")
    if parts[0] in ("scripts", "benchmarks"):
        return 4, parts[0]
    if parts[:2] == ["sdcguard", "testing"]:
        return 4, "testing"
    if parts[0] == "fleet_scan":
        return 2, "fleet_scan"
    assert parts[0] == "sdcguard", name
    if len(parts) == 1:
        return 0, "core"
    if parts[1] in ("cli", "__main__"):
        return 3, "cli"
    if parts[1] in CORE:
        return 0, "core"
    if parts[1] in WINGS:
        return 1, WINGS[parts[1]]
    raise AssertionError(
        f"{name}: a new top-level module of sdcguard needs its place in a layer (tests/"
        "test_structure.py: CORE or WINGS)"
    )


def test_every_module_has_a_place_in_the_layers() -> None:
    for name in modules():
        layer(name)


def test_the_import_graph_has_no_circle() -> None:
    assert cycles(graph()) == []


def test_imports_only_go_down_the_layers_and_no_wing_imports_another() -> None:
    wrong = []
    for name, targets in graph().items():
        rank, group = layer(name)
        for target in sorted(targets):
            t_rank, t_group = layer(target)
            if t_rank > rank or (t_rank == rank and t_group != group and rank != 4):
                if (name, target) not in CROSSING_ALLOWED:
                    wrong.append(f"{name} ({group}) imports {target} ({t_group})")
    assert wrong == []


def _folder_layer(name: str) -> tuple[str, int] | None:
    for wing, layers in FOLDER_LAYERS.items():
        if name.startswith(wing + "."):
            part = name[len(wing) + 1 :].split(".")[0]
            found = [k for k, members in enumerate(layers) if part in members]
            assert found, f"{name}: its place in {wing}'s layers (tests/test_structure.py: FOLDER_LAYERS)"
            return wing, found[0]
    return None


def test_inside_a_wing_imports_only_go_down_its_folders() -> None:
    wrong = []
    for name, targets in graph().items():
        here = _folder_layer(name)
        if here is None:
            continue
        for target in sorted(targets):
            there = _folder_layer(target)
            if there is not None and there[0] == here[0] and there[1] > here[1]:
                wrong.append(f"{name} imports {target}, a layer above it")
    assert wrong == []


def test_no_folder_holds_more_than_15_modules() -> None:
    """A folder that grows past the cap grows subfolders by job, not a longer hallway."""
    counts: dict[str, int] = {}
    for m in library():
        if not m.is_package:
            folder = m.path.parent.relative_to(ROOT).as_posix()
            counts[folder] = counts.get(folder, 0) + 1
    assert {f: n for f, n in counts.items() if n > MAX_FOLDER_MODULES} == {}


def test_every_allowed_crossing_is_still_there() -> None:
    """An exception that is no longer needed goes: the list says what crosses today, nothing more."""
    edges = graph()
    assert [pair for pair in CROSSING_ALLOWED if pair[1] not in edges.get(pair[0], ())] == []


def test_the_scanner_needs_neither_the_cli_nor_the_training_side() -> None:
    """``python -m fleet_scan`` is a job of its own: the fleet side never imports torch's side or the CLI."""
    for name, targets in graph().items():
        if name.startswith(("fleet_scan", "sdcguard.fleet")):
            assert not {t for t in targets if t.startswith(("sdcguard.cli", "sdcguard.training"))}, name


def _long_functions() -> list[str]:
    out = []
    for m in library():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and f"{m.rel}:{node.name}" not in SIZE_EXCEPTIONS:
                    out.append(f"{m.rel}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_module_over_500_lines_no_function_over_80() -> None:
    long_modules = [
        f"{m.rel} ({n} lines)"
        for m in library()
        if (n := len(m.path.read_text().splitlines())) > MAX_MODULE_LINES and m.rel not in SIZE_EXCEPTIONS
    ]
    assert long_modules == []
    assert _long_functions() == []


def test_no_module_of_the_fleet_store_over_400_lines() -> None:
    """The store grew into one 61-method class split across files by line count; it is held by job instead."""
    long_modules = [
        f"{m.rel} ({n} lines)"
        for m in library()
        if m.rel.startswith(STORE) and (n := len(m.path.read_text().splitlines())) > MAX_STORE_MODULE_LINES
    ]
    assert long_modules == []


def _only_bases(sources: dict[str, tuple[ast.Module, bool]]) -> list[str]:
    """The classes of ``sources`` (``module -> (tree, is_package)``) with one subclass, in another module, and no
    other use: nothing names them but that subclass's bases and the imports that bring them there."""
    defined = {
        (name, n.name) for name, (tree, _) in sources.items() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
    }
    subclasses: dict[tuple[str, str], list[tuple[str, str]]] = {}
    uses: dict[tuple[str, str], int] = {}
    for name, (tree, is_package) in sources.items():
        package = name.split(".") if is_package else name.split(".")[:-1]
        local = {cls: (module, cls) for module, cls in defined if module == name}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = ".".join([*package[: len(package) - node.level + 1], node.module or ""]).strip(".")
                for a in node.names:
                    local[a.asname or a.name] = (source if node.level else node.module or "", a.name)
        bases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Name) and local.get(base.id) in defined:
                        subclasses.setdefault(local[base.id], []).append((name, node.name))
                        bases.add(id(base))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and id(node) not in bases and local.get(node.id) in defined:
                uses[local[node.id]] = uses.get(local[node.id], 0) + 1
    return [
        f"{module}.{cls} is only the base of {sub[0][0]}.{sub[0][1]}"
        for (module, cls), sub in sorted(subclasses.items())
        if len(sub) == 1 and sub[0][0] != module and not uses.get((module, cls))
    ]


def test_no_class_is_only_the_base_of_one_class_in_another_module() -> None:
    """Compose, don't inherit: a class whose one role is to be the base of one class in another module is a part of
    that class kept elsewhere (the store's StoreQueries and StoreMaintenance were: ``Store`` inherited them, and
    nothing else named them), so give it a job of its own and make it an attribute. A base with two or more
    subclasses is a shared shape (an error's kinds, a protocol's implementations), one used on its own too (made,
    passed, named in a type) is a class in its own right, and one beside its only subclass is its module's own
    business."""
    assert _only_bases({m.name: (m.tree, m.is_package) for m in library()}) == []


def test_the_only_base_rule_finds_a_part_kept_elsewhere() -> None:
    """The rule above flags what it is for, and only that: ``Reads`` (used nowhere but as ``Store``'s base, in
    another module) is flagged; ``Shape`` (two subclasses) and ``Used`` (made on its own too) are not."""
    sources = {
        "pkg.parts": "class Reads:\n    pass\n\n\nclass Shape:\n    pass\n\n\nclass Used:\n    pass\n",
        "pkg.whole": (
            "from .parts import Reads, Shape, Used\n\n\nclass Store(Reads):\n    pass\n\n\n"
            "class A(Shape):\n    pass\n\n\nclass B(Shape):\n    pass\n\n\nclass C(Used):\n    pass\n\n\n"
            "default = Used()\n"
        ),
    }
    found = _only_bases({name: (ast.parse(text), False) for name, text in sources.items()})
    assert found == ["pkg.parts.Reads is only the base of pkg.whole.Store"]


def _room(name: str) -> str:
    """A module of the fleet store's room: its subfolder (``sqlite``, ``postgres``, ``schema``, ``writes``) as one
    room, a module at the store's top as its own."""
    parts = name.split(".")
    return ".".join(parts[:4]) if len(parts) > 4 else name


def test_the_stores_rooms_import_one_way() -> None:
    """No import back up: with each of the store's subfolders taken as one room, no room imports a room that
    imports it (as postgres/transfer.py once imported connection.py, which imported postgres/)."""
    prefix = "sdcguard.fleet.store."
    edges: dict[str, set[str]] = {}
    for name, targets in graph().items():
        if name.startswith(prefix):
            here = _room(name)
            edges.setdefault(here, set()).update(_room(t) for t in targets if t.startswith(prefix) and _room(t) != here)
    assert cycles({k: frozenset(v) for k, v in edges.items()}) == []


# ------------------------------------------------------------------------------------ references in docstrings

_ROLE = re.compile(r":(?:mod|func|class|data|attr|meth|exc):`~?(\.*)([A-Za-z_][\w.]*)`")


def _defines(module: str, name: str) -> bool:
    m = modules().get(module)
    if m is None:
        return False
    text = m.path.read_text()
    return (
        re.search(
            rf"^\s*(def|class|async def)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b|"
            rf'"{name}"',
            text,
            re.M,
        )
        is not None
    )


def _resolves(target: str) -> bool:
    parts = target.split(".")
    for k in range(len(parts), 0, -1):
        head = ".".join(parts[:k])
        if head in modules():
            rest = parts[k:]
            # module, module.name, or module.Class.member (the class must be there)
            return not rest or _defines(head, rest[0])
    return False


@pytest.mark.parametrize("package", ["sdcguard", "fleet_scan"])
def test_docstrings_name_modules_and_names_that_exist(package: str) -> None:
    """A reference such as :mod:`sdcguard.rates` to a module that moved is caught (relative ones too)."""
    stale = []
    for name, m in modules().items():
        if name.split(".")[0] != package:
            continue
        base = name.split(".") if m.is_package else name.split(".")[:-1]
        for lineno, line in enumerate(m.path.read_text().splitlines(), 1):
            for match in _ROLE.finditer(line):
                dots, ref = match.groups()
                if dots:
                    up = base[: len(base) - (len(dots) - 1)]
                    ref = ".".join([*up, ref])
                elif not ref.startswith(("sdcguard", "fleet_scan")):
                    continue
                if not _resolves(ref):
                    stale.append(f"{m.rel}:{lineno}: {match.group(0)}")
    assert stale == []


_FILE_SUFFIXES = {"json", "db", "toml", "yaml", "yml", "log", "txt", "csv", "html", "png", "sbatch", "service"}
"""``sdcguard.json`` and the like are file names, not modules."""


def test_readme_and_docs_name_modules_that_exist() -> None:
    stale = []
    for doc in (ROOT / "README.md", ROOT / "kernels" / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for lineno, line in enumerate(doc.read_text().splitlines(), 1):
            for ref in re.findall(r"`((?:sdcguard|fleet_scan)(?:\.[A-Za-z_]\w*)+)", line):
                if ref.rpartition(".")[2] not in _FILE_SUFFIXES and not _resolves(ref):
                    stale.append(f"{doc.name}:{lineno}: {ref}")
    assert stale == []
