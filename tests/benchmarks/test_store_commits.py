"""``benchmarks/store_commits.py`` reads every figure the store's benchmarks print: the ingest's rate and how soon a
scan is in the report, each timed row of ``report_scale.py``, its recording and prune times, ``db refresh``, and the
CLI report's three runs (their median), from the lines the two scripts print on a tiny run."""

from __future__ import annotations

import pytest

from benchmarks.store_commits import figures
from tests._bench import run_benchmark


@pytest.mark.slow
def test_every_figure_of_both_benchmarks_is_read() -> None:
    ingest = run_benchmark("store_ingest.py", "--writers", "2", "--scans", "1", "--backends", "sqlite", timeout=240)
    scale = run_benchmark("report_scale.py", "--devices", "16", "--days", "3", "--merge-days", "1", timeout=240)
    assert ingest.returncode == 0 and scale.returncode == 0, ingest.stderr[-2000:] + scale.stderr[-2000:]
    got = figures(ingest.stdout + scale.stdout)
    assert got["ingest sqlite: results/s"] > 0 and got["ingest sqlite: a finished scan in the report, CLI (s)"] > 0
    for name in (
        "node stores' scans recorded (s)",
        "later days recorded into the fleet store, prune included (s)",
        "  of which prune (s)",
        "sdcguard db refresh (s)",
        "CLI report, 7 days (median of 3 runs, s)",
        "CLI report, 30 days from a midnight (median of 3 runs, s)",
    ):
        assert name in got, (name, sorted(got))
    timed = [name for name in got if name.endswith("(wall s)")]
    assert any(n.startswith("merge 2 node stores") for n in timed) and any(n.startswith("fleet policy") for n in timed)
    assert any(n.startswith("report in-process, 7 days") for n in timed), sorted(got)
