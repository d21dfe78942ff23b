"""The fleet side stays light and in shape: no torch or cupy, SQL only in the store, no import cycles, no private
names borrowed across modules, and the public names load lazily from ``sdcguard``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEET = sorted((ROOT / "sdcguard" / "fleet").glob("*.py"))
STORE_MODULES = {"store.py", "queries.py", "case_queries.py", "maintenance.py", "connection.py", "schema.py"}
SIDE = [*FLEET, *sorted((ROOT / "fleet_scan").glob("*.py")), *sorted((ROOT / "sdcguard" / "cli").glob("*.py"))]


def test_store_report_policy_import_neither_torch_nor_cupy() -> None:
    names = [f"sdcguard.fleet.{p.stem}" for p in FLEET if p.stem != "__init__"]
    code = (
        "import sys, sdcguard\n"
        f"import {', '.join(names)}\n"
        "import sdcguard.cli.report, sdcguard.cli.quarantine, sdcguard.cli.merge, sdcguard.cli.policy\n"
        "import sdcguard.cli.prune, fleet_scan.worker, fleet_scan.runner, fleet_scan.sim, sdcguard.golden.references\n"
        "from sdcguard.fleet import store, policy\n"
        "assert sdcguard.Store is store.Store and sdcguard.QuarantinePolicy is policy.QuarantinePolicy\n"
        "assert sdcguard.apply_policy is policy.apply_policy\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy', 'matplotlib'))\n"
        "print(bad)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


_SQL = re.compile(r"\b(SELECT\s+\S+.*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+"
                  r"(TEMP\s+)?(TABLE|INDEX)|PRAGMA\s+\w+)\b", re.IGNORECASE)


def test_only_the_store_holds_sql() -> None:
    offenders = []
    for path in SIDE:
        if path.parent.name == "fleet" and path.name in STORE_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr in ("_conn", "_write", "_rows", "_dicts", "_one"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert offenders == []


def _imports(path: Path, package: str) -> set[str]:
    """Modules of the same package that ``path`` imports (outside ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.add(f"{package}.{node.module}" if node.module else package)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
            out.add(node.module)
    return out


def test_no_two_fleet_modules_import_each_other_and_no_private_name_crosses() -> None:
    for package, paths in (("sdcguard.fleet", FLEET), ("fleet_scan", sorted((ROOT / "fleet_scan").glob("*.py")))):
        graph = {f"{package}.{p.stem}": _imports(p, package) for p in paths}
        for a, deps in graph.items():
            for b in deps:
                assert a not in graph.get(b, set()), f"{a} and {b} import each other"
    for path in SIDE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith(("sdcguard", "fleet_scan"))):
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
                assert not private, f"{path.relative_to(ROOT)} imports private {private} from {node.module}"
