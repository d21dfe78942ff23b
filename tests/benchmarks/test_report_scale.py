"""``benchmarks/report_scale.py`` on a tiny fleet: every step runs and prints its lines, the CLI report's runs read
the verdicts ``db refresh`` kept, next to a run that computes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "report_scale.py"


@pytest.mark.slow
def test_a_tiny_fleet_is_built_merged_and_measured() -> None:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--devices", "16", "--days", "2", "--merge-days", "1"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "merge 2 node stores" in out and "fleet policy" in out, out
    assert "sdcguard db refresh of the 4 windows" in out, out
    runs = [line for line in out.splitlines() if line.startswith("sdcguard report --format json (CLI")]
    assert len(runs) == 4 and all("3 runs" in r and "with --slow-max-age 0" in r for r in runs), out
    assert "goal: CLI report over 7 and 30 days < 2 s in every run" in out, out
