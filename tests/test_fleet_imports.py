"""The report side stays light: no torch or cupy, and the public names load lazily."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_store_report_policy_import_neither_torch_nor_cupy() -> None:
    code = (
        "import sys, sdcguard\n"
        "import sdcguard.fleet.store, sdcguard.fleet.rates, sdcguard.fleet.policy, sdcguard.fleet.actions, sdcguard.fleet.report, sdcguard.fleet.merge\n"
        "import sdcguard.fleet.prometheus, sdcguard.cli.report, sdcguard.cli.quarantine, sdcguard.cli.merge\n"
        "assert sdcguard.Store is sdcguard.fleet.store.Store and sdcguard.QuarantinePolicy is sdcguard.fleet.policy.QuarantinePolicy\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy', 'matplotlib'))\n"
        "print(bad)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
