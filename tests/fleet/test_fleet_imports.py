"""The fleet side stays light and in shape: no torch or cupy, SQL only in the store (psycopg only in its PostgreSQL
backend), no import cycles, no private names borrowed across modules, and the public names load lazily from
``sdcguard``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLEET = sorted((ROOT / "sdcguard" / "fleet").rglob("*.py"))
STORE = ROOT / "sdcguard" / "fleet" / "store"
"""The store's folder: the only place SQL is written."""
SIDE = [*FLEET, *sorted((ROOT / "fleet_scan").rglob("*.py")), *sorted((ROOT / "sdcguard" / "cli").glob("*.py"))]


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_store_report_policy_import_neither_torch_nor_cupy() -> None:
    names = [_name(p) for p in FLEET]
    code = (
        "import sys, sdcguard\n"
        f"import {', '.join(names)}\n"
        "import sdcguard.cli.report, sdcguard.cli.quarantine, sdcguard.cli.merge, sdcguard.cli.policy\n"
        "import sdcguard.cli.prune, fleet_scan.device_scan.worker, fleet_scan.runner, fleet_scan.sim\n"
        "import sdcguard.golden.references\n"
        "from sdcguard.fleet import store, policy\n"
        "assert sdcguard.Store is store.Store and sdcguard.QuarantinePolicy is policy.QuarantinePolicy\n"
        "assert sdcguard.apply_policy is policy.apply_policy\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy', 'matplotlib'))\n"
        "print(bad)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


_SQL = re.compile(
    r"\b(SELECT\s+\S+.*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+"
    r"(TEMP\s+)?(TABLE|INDEX)|PRAGMA\s+\w+)\b",
    re.IGNORECASE,
)


def test_only_the_store_holds_sql() -> None:
    offenders = []
    for path in SIDE:
        if path.is_relative_to(STORE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr in ("_conn", "_write", "_rows", "_dicts", "_one"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert offenders == []


_OWN_EXTENSIONS = {"__version__", "_fpcore", "_core"}
"""Names that may be imported though they start with ``_``: the version, and the C extensions a package builds for
its own modules (``sdcguard._fpcore``, ``sdcguard.training.checksums._core``)."""


def test_no_private_name_crosses_a_module() -> None:
    """(That no two modules import each other is tests/test_structure.py's, for the whole library.)"""
    for path in [*SIDE, *sorted((ROOT / "sdcguard").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith(("sdcguard", "fleet_scan"))
            ):
                private = [a.name for a in node.names if a.name.startswith("_") and a.name not in _OWN_EXTENSIONS]
                assert not private, f"{path.relative_to(ROOT)} imports private {private} from {node.module}"


def test_psycopg_is_the_postgresql_backends_alone_and_a_sqlite_store_never_imports_it(tmp_path: Path) -> None:
    for path in sorted((ROOT / "sdcguard").rglob("*.py")) + sorted((ROOT / "fleet_scan").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("sdcguard/fleet/store/postgres/", "sdcguard/testing/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "psycopg"], rel
    code = (
        "import sys\nfrom sdcguard.fleet.store.spool import open_writer\nfrom sdcguard.fleet.report.devices import "
        f"build_report\nwith open_writer({str(tmp_path / 's.db')!r}) as s:\n    build_report(s, since=None)\n"
        "print(sorted(m for m in sys.modules if m.startswith('psycopg')))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
