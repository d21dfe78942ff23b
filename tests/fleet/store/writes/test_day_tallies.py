"""Per-day tallies: ``day_tallies`` always equals what the rows add up to, through every write (scan batches
that grow a case's row, across midnight; merges that replace rows; prunes), and a window's counts read from
tallies plus its partial first day of rows are exactly those of the rows."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.store.store import Store
from tests._fleet import assert_tallies_match_rows, result

DAY = 86400.0
START = 20_000 * DAY  # a UTC midnight

# (node, device, [(hour offset, passed, case, attempt)...] batches, finish?) or ("merge",) or ("prune", days)
_batch = st.lists(
    st.tuples(st.integers(0, 60), st.booleans(), st.integers(0, 2), st.integers(0, 1)), min_size=1, max_size=4
)
_op = st.one_of(
    st.tuples(
        st.just("scan"), st.integers(0, 1), st.integers(0, 2), st.lists(_batch, min_size=1, max_size=3), st.booleans()
    ),
    st.tuples(st.just("merge"), st.just(0), st.just(0), st.just([]), st.just(False)),
    st.tuples(st.just("prune"), st.integers(0, 1), st.integers(1, 3), st.just([]), st.just(False)),
)


def _window_from_rows(path: Path, since: float) -> dict[str, tuple[int, int]]:
    """Executions and failures per device since ``since``, straight from the rows (no roll-ups in these stores:
    only called on stores never pruned)."""
    with closing(sqlite3.connect(path)) as c:
        rows = c.execute(
            "SELECT device, TOTAL((attempt = 0) * executions), TOTAL(attempt = 0 AND passed = 0) "
            "FROM results WHERE started_at >= ? GROUP BY device",
            (since,),
        ).fetchall()
    return {d: (int(n), int(k)) for d, n, k in rows}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_op, max_size=12), st.floats(0, 4 * DAY))
def test_day_tallies_follow_every_write(tmp_path_factory: pytest.TempPathFactory, ops, since_offset) -> None:
    d = tmp_path_factory.mktemp("tally")
    nodes = [d / "n0.db", d / "n1.db"]
    fleet, whole = d / "fleet.db", d / "whole.db"  # the whole fleet is merged, never pruned
    clock = START
    skipped = 0  # input scans the fleet's merge skipped: older than its horizon, never merged before it pruned
    for kind, n, dev, batches, finish in ops:
        clock += 0.4 * DAY
        if kind == "scan":
            with Store.open(nodes[n]) as s:
                device = f"sim:{n}{dev}"
                sid = s.scans.begin(device=device, host=f"n{n}", budget_s=60.0, started_at=clock)
                for batch in batches:  # hours apart: a case's folded row grows across midnight
                    s.scans.record(
                        sid,
                        [
                            result(
                                device,
                                passed=p,
                                t=clock + h * 3600.0,
                                case=f"c{c}",
                                family=f"f{c % 2}",
                                attempt=a,
                                duration_s=(h + 1) / 64,
                            )
                            for h, p, c, a in batch
                        ],
                    )
                if finish:
                    s.scans.finish(sid, "complete", finished_at=clock + 61 * 3600.0)
        elif kind == "merge":
            existing = [p for p in nodes if p.exists()]
            if existing:
                skipped += sum(m.skipped_scans for m in merge_stores(fleet, existing))
                merge_stores(whole, existing)
        elif kind == "prune" and fleet.exists():
            with Store.open(fleet) as s:
                s.maintenance.prune(before=clock - dev * DAY)
    for path in [*nodes, fleet, whole]:
        if path.exists():
            assert_tallies_match_rows(path)
    if whole.exists():
        since = START + since_offset
        with Store.open(whole, create=False) as s:
            got = {t.device: (t.executions, t.failures) for t in s.counts.tallies(since=since, by="device")}
        assert got == _window_from_rows(whole, since)
    if fleet.exists() and whole.exists() and not skipped:
        with Store.open(fleet, create=False) as f, Store.open(whole, create=False) as w:
            # all time: rows + roll-ups
            assert f.counts.tallies(by="device_family") == w.counts.tallies(by="device_family")


def test_an_older_store_gains_its_day_tallies(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with Store.open(path) as s:
        for i in range(3):
            sid = s.scans.begin(device="sim:1", host="n", budget_s=60.0, started_at=START + i * DAY)
            s.scans.record(
                sid, [result("sim:1", t=START + i * DAY + j, passed=j != 2) for j in range(4)], finish="complete"
            )
        before = s.counts.tallies(since=START + 0.5 * DAY, by="device")
    with closing(sqlite3.connect(path)) as c, c:  # as schema 7 left it
        c.execute("DROP TABLE day_tallies")
        c.execute("DROP INDEX results_time")
        c.execute("CREATE INDEX results_rates ON results(device, family, started_at, duration_s, executions)")
        c.execute("PRAGMA user_version = 7")
    with Store.open(path) as s:
        assert s.counts.tallies(since=START + 0.5 * DAY, by="device") == before
    assert_tallies_match_rows(path)
