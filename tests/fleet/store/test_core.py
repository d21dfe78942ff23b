"""Eight processes recording into one store at once: no row lost, never "database is locked"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdcguard.fleet.store.store import Store
from tests._fleet import assert_tallies_match_rows, query

ROOT = Path(__file__).resolve().parents[3]

_WRITER = """
import sys
from sdcguard.records import CaseResult, Incident
import pytest

from sdcguard.fleet.store.store import Store

path, worker, scans, per_scan = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
device = f"sim:{worker}"
for s in range(scans):
    # A fresh connection per scan, as separate scanner invocations would open it.
    with Store.open(path) as store:
        sid = store.scans.begin(device=device, host=f"node{worker}", budget_s=10.0)
        half = per_scan // 2
        rows = [CaseResult(device=device, case=f"alu.c{i}", family="alu", seed=i, passed=(i % 7 != 0),
                           duration_s=0.01) for i in range(per_scan)]
        store.scans.record(sid, rows[:half])
        store.scans.record(sid, rows[half:], finish="complete")
        if s % 5 == 0:
            store.training.record_incident(Incident(kind="replay", step=s, suspect_ranks=(worker,), device=device,
                                           detail="drill", devices=(device,), hosts=(f"node{worker}",)))
print("ok")
"""


@pytest.mark.slow
def test_eight_writers_lose_nothing_and_never_see_locked(store_db: str) -> None:
    """On a PostgreSQL server the writers run side by side (a connection each, a device lock each): the same."""
    path = store_db
    workers, scans, per_scan = 8, 10, 40
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(w), str(scans), str(per_scan)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(workers)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert "locked" not in err, err
        assert p.returncode == 0 and out.strip() == "ok", err
    with Store.open(path, create=False) as store:
        tallies = store.counts.tallies(by="device")
        # every execution is counted (passing ones folded per scan and case: 40 cases, 1 in 7 failing)
        assert [t.executions for t in tallies] == [scans * per_scan] * workers
        assert [t.failures for t in tallies] == [scans * len(range(0, per_scan, 7))] * workers
        assert len(store.training.incidents()) == workers * len(range(0, scans, 5))
    assert query(path, "SELECT COUNT(*) FROM scans WHERE status = 'complete'")[0][0] == workers * scans
    # Per scan, rows are numbered 0..n-1 without gaps or duplicates (the two batches never interleaved badly),
    # and they hold every execution of the scan.
    bad = query(
        path,
        "SELECT COUNT(*) FROM (SELECT scan FROM results GROUP BY scan HAVING SUM(executions) != ? "
        "OR MAX(seq) != COUNT(*) - 1) AS wrong",
        (per_scan,),
    )
    assert bad[0][0] == 0
    assert_tallies_match_rows(path)
