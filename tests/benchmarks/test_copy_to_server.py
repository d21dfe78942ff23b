"""``benchmarks/copy_to_server.py``: a SQLite fleet store copied table by table into a server store reports the
same, and the server store takes new scans after it (its identity sequences past the copied ids)."""

from __future__ import annotations

import json
from pathlib import Path

from sdcguard.fleet.report.devices import build_report, report_json
from sdcguard.fleet.store.store import Store
from sdcguard.testing.postgres import PostgresServer
from tests._bench import run_benchmark
from tests._fleet import NOW, clean, result, scan


def test_a_copied_store_reports_the_same_and_takes_new_scans(tmp_path: Path, pg_server: PostgresServer) -> None:
    path = tmp_path / "fleet.db"
    with Store.open(path) as store:
        for i in range(3):
            scan(store, f"cpu:n{i}:0", [*clean(f"cpu:n{i}:0", 4), result(f"cpu:n{i}:0", passed=i != 1)])
        store.quarantine.add("cpu:n1:0", reason="test", now=NOW)
        want = report_json(build_report(store, since=None, now=NOW, families=True))
    url = pg_server.fresh_url()
    p = run_benchmark("copy_to_server.py", str(path), url)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "results: 4 rows" in p.stdout and "VACUUM (ANALYZE)" in p.stdout, p.stdout
    with Store.open(url) as server:
        assert report_json(build_report(server, since=None, now=NOW, families=True)) == want
        scan(server, "cpu:n0:0", clean("cpu:n0:0", 2), t=NOW - 60)
        rows = {r["device"]: r for r in json.loads(report_json(build_report(server, since=None, now=NOW)))}
    assert rows["cpu:n0:0"]["scans"] == 2 and rows["cpu:n1:0"]["status"] == "quarantined"
    again = run_benchmark("copy_to_server.py", str(path), url)
    assert again.returncode != 0 and "holds a store already" in again.stderr
