"""``benchmarks/report_scale.py`` on a tiny fleet: every step runs and prints its lines, the CLI report's runs read
the verdicts and the report ``db refresh`` kept, next to runs that compute them."""

from __future__ import annotations

import re

import pytest

from tests._bench import run_benchmark


@pytest.mark.slow
def test_a_tiny_fleet_is_built_merged_and_measured() -> None:
    p = run_benchmark("report_scale.py", "--devices", "16", "--days", "2", "--merge-days", "1", timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "merge 2 node stores" in out and "fleet policy" in out, out
    assert "sdcguard db refresh of the 4 windows" in out, out
    runs = [line for line in out.splitlines() if line.startswith("sdcguard report --format json (CLI")]
    assert len(runs) == 4 and all("3 runs" in r and "--computed" in r and "--slow-max-age 0" in r for r in runs), out
    assert all("kept report read" in r for r in runs[:2]), out  # a quarter hour old, a quarter hour of scans since
    computed = re.search(r"kept report read, ([\d,]+) of ([\d,]+) rows computed", runs[0])
    assert computed and 0 < int(computed[1]) < int(computed[2]), out  # those scans' devices computed, no other
    assert "goal: CLI report over 7 and 30 days < 2 s in every run" in out, out
