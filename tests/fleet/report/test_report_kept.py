"""Kept reports: what ``sdcguard report`` reads at fleet scale instead of computing every device's row.

The rule it must keep (:mod:`sdcguard.fleet.report.kept`): the report from a kept one is, byte for byte, the report
computed from the store, whatever was written, merged, pruned, quarantined or reported since the refresh and however
far the window moved; it computes only the rows of the devices that changed; and it is not used where it cannot
speak (too old, another confidence, the window's first day moved, a prune since, damaged).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.durations import DAY_S
from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.report.devices import build_report
from sdcguard.fleet.report.kept import ReportLines, keep_report, kept_lines
from sdcguard.fleet.slow_fleet import fleet_slowness
from sdcguard.fleet.store.store import Store
from sdcguard.records import SLOW_KIND, DeviceInfo, Incident
from tests._fleet import NOW, query, result, scan

DEVICES = [f"cpu:n{i // 2}:{i % 2}" for i in range(6)]
WINDOWS: list[float | None] = [2 * DAY_S, None]
MAX_AGE = 3600.0


def _scan(store: Store, device: str, t: float, *, failed: bool = False) -> None:
    rows = [result(device, t=t + i, case=f"c{i}", family=("gemm", "alu")[i % 2]) for i in range(4)]
    if failed:
        rows.append(result(device, passed=False, t=t + 5))
    scan(store, device, rows, host=device.split(":")[1], t=t)


def _refresh(store: Store, now: float) -> None:
    """What ``sdcguard db refresh`` does, for each window."""
    for w in WINDOWS:
        since = None if w is None else now - w
        fleet_slowness(store, since=since, now=now, keep=True)
        keep_report(store, since=since, now=now, slow_max_age_s=1.0)


def _both(store: Store, since: float | None, now: float) -> tuple[ReportLines | None, str]:
    """The report from the kept one (None when it is not used) and the report computed, as JSON."""
    kept = kept_lines(store, since=since, now=now, slow_max_age_s=MAX_AGE)
    computed = ReportLines.of(build_report(store, since=since, now=now, slow_max_age_s=MAX_AGE)).json()
    return kept, computed


def _computed_rows(lines: ReportLines) -> int:
    return sum(not isinstance(x, str) for *_, x in lines.lines)


def _fleet(store: Store, t: float) -> None:
    for i, d in enumerate(DEVICES):
        _scan(store, d, t + 60 * i, failed=i == 3)


def test_a_kept_report_computes_only_the_changed_devices_and_equals_the_computed_one(store_db: str) -> None:
    with Store.open(store_db) as store:
        _fleet(store, NOW - 3 * 3600)
        _refresh(store, NOW)
        for w in WINDOWS:
            since = None if w is None else NOW + 60 - w
            kept, computed = _both(store, since, NOW + 60)
            assert kept is not None and kept.json() == computed
            assert _computed_rows(kept) == 0
        _scan(store, DEVICES[0], NOW + 120)  # one device scans: only its row is computed
        store.quarantine.add(DEVICES[1], reason="by hand", now=NOW + 130)  # a status changes: its kept text is patched
        kept, computed = _both(store, NOW + 200 - 2 * DAY_S, NOW + 200)
        assert kept is not None and kept.json() == computed
        assert _computed_rows(kept) == 1
        assert json.loads(kept.json())[0]["device"] == DEVICES[1]  # quarantined first, as computed


def test_devices_whose_oldest_evidence_left_the_window_are_computed(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        old = NOW - 2 * DAY_S + 600  # in the window of a refresh at NOW, out of it ten minutes later
        _scan(store, DEVICES[0], old, failed=True)
        _scan(store, DEVICES[1], NOW - 3600)
        _refresh(store, NOW)
        kept, computed = _both(store, NOW + 1800 - 2 * DAY_S, NOW + 1800)
        assert kept is not None and kept.json() == computed
        assert _computed_rows(kept) == 1
        row = {r["device"]: r for r in json.loads(computed)}[DEVICES[0]]
        assert row["executions"] == 0 and row["status"] == "healthy"  # its failure left with it


def test_a_late_write_of_old_evidence_is_seen_by_its_version(tmp_path: Path) -> None:
    """A spool forwarded hours late writes scans that started before the refresh: no time tells them, the version
    does."""
    with Store.open(tmp_path / "f.db") as store:
        _fleet(store, NOW - 5 * 3600)
        _refresh(store, NOW)
        _scan(store, DEVICES[2], NOW - 4 * 3600, failed=True)
        kept, computed = _both(store, NOW + 60 - 2 * DAY_S, NOW + 60)
        assert kept is not None and kept.json() == computed and _computed_rows(kept) == 1
        assert {r["device"]: r["failures"] for r in json.loads(computed)}[DEVICES[2]] == 1


def test_a_merge_changes_the_versions_of_the_devices_it_changes_only(tmp_path: Path) -> None:
    with Store.open(tmp_path / "node.db") as node:
        _scan(node, DEVICES[0], NOW - 6 * 3600)
    merge_stores(tmp_path / "fleet.db", [tmp_path / "node.db"])
    with Store.open(tmp_path / "fleet.db") as fleet:
        _fleet(fleet, NOW - 5 * 3600)
        _refresh(fleet, NOW)
    merge_stores(tmp_path / "fleet.db", [tmp_path / "node.db"])  # nothing new: every kept row still speaks
    with Store.open(tmp_path / "fleet.db") as fleet:
        kept, computed = _both(fleet, NOW + 60 - 2 * DAY_S, NOW + 60)
        assert kept is not None and kept.json() == computed and _computed_rows(kept) == 0
    with Store.open(tmp_path / "node.db") as node:
        _scan(node, DEVICES[4], NOW - 4 * 3600, failed=True)
        _scan(node, "cpu:new:0", NOW - 4 * 3600)
        node.scans.record_devices([DeviceInfo(id=DEVICES[2], host="moved", kind="cpu", model="Xeon")], now=NOW)
    merge_stores(tmp_path / "fleet.db", [tmp_path / "node.db"])
    with Store.open(tmp_path / "fleet.db") as fleet:
        kept, computed = _both(fleet, NOW + 60 - 2 * DAY_S, NOW + 60)
        assert kept is not None and kept.json() == computed
        assert _computed_rows(kept) == 3  # the merged device, the new one, the one with a new host
        rows = {r["device"]: r for r in json.loads(computed)}
        assert len(rows) == len(DEVICES) + 1 and rows[DEVICES[2]]["host"] == "moved"


def test_a_kept_report_is_not_used_where_it_cannot_speak(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fleet(store, NOW - 5 * 3600)
        _refresh(store, NOW)
        since = NOW + 60 - 2 * DAY_S
        assert kept_lines(store, since=since, now=NOW + 60, slow_max_age_s=MAX_AGE) is not None
        assert kept_lines(store, since=since, now=NOW + 60, slow_max_age_s=0) is None  # --slow-max-age 0: compute
        assert kept_lines(store, since=since, now=NOW + 60, slow_max_age_s=30) is None  # older than allowed
        assert kept_lines(store, since=since, now=NOW - 60, slow_max_age_s=MAX_AGE) is None  # kept in the future
        assert kept_lines(store, since=since, now=NOW + 60, confidence=0.99, slow_max_age_s=MAX_AGE) is None
        assert kept_lines(store, since=NOW + 60 - DAY_S, now=NOW + 60, slow_max_age_s=MAX_AGE) is None  # no 1d one
        late = NOW + 17 * 3600  # the window's start passed a UTC midnight: other whole days
        assert kept_lines(store, since=late - 2 * DAY_S, now=late, slow_max_age_s=DAY_S) is None
        assert kept_lines(store, since=None, now=late, slow_max_age_s=DAY_S) is not None  # all time has no start
        store.maintenance.prune(before=NOW - DAY_S)
        assert kept_lines(store, since=since, now=NOW + 60, slow_max_age_s=MAX_AGE) is None
        _refresh(store, NOW)
        assert kept_lines(store, since=since, now=NOW + 60, slow_max_age_s=MAX_AGE) is not None
    key = f"summary.report.{round(2 * DAY_S)}"
    (head,) = query(tmp_path / "f.db", "SELECT value FROM meta WHERE key = ?", (key,))
    damaged = json.loads(head[0])
    damaged["offsets"] = damaged["offsets"][:-8]  # cut short: the offsets of fewer devices than it names
    with closing(sqlite3.connect(tmp_path / "f.db")) as c, c:
        c.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(damaged), key))
    with Store.open(tmp_path / "f.db") as store, caplog.at_level(logging.WARNING):
        assert kept_lines(store, since=since, now=NOW + 60, slow_max_age_s=MAX_AGE) is None
    assert "cannot be read" in caplog.text


def test_a_slow_incident_is_applied_live_as_it_comes_and_as_it_leaves(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fleet(store, NOW - 5 * 3600)
        leaving = Incident(
            kind=SLOW_KIND, step=3, suspect_ranks=(1,), device=DEVICES[4], detail="2x", time=NOW - 2 * DAY_S + 600
        )
        store.training.record_incident(leaving)  # in the window of the refresh, out of it 20 minutes later
        _refresh(store, NOW)
        incident = Incident(
            kind=SLOW_KIND, step=3, suspect_ranks=(1,), device=DEVICES[5], detail="1.9x slower", time=NOW - 3000
        )
        store.training.record_incident(incident)
        kept, computed = _both(store, NOW + 1200 - 2 * DAY_S, NOW + 1200)
        assert kept is not None and kept.json() == computed
        slow = {r["device"]: r["slow"] for r in json.loads(computed)}
        assert slow[DEVICES[5]] is True and slow[DEVICES[4]] is False


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("scan"), st.sampled_from(DEVICES), st.integers(-50, 0), st.booleans()),
        st.tuples(st.just("late"), st.sampled_from(DEVICES), st.integers(-3000, -200), st.booleans()),
        st.tuples(st.just("tick"), st.integers(1, 600)),
        st.tuples(st.just("refresh")),
        st.tuples(st.just("quarantine"), st.sampled_from(DEVICES)),
        st.tuples(st.just("release"), st.sampled_from(DEVICES)),
        st.tuples(st.just("incident"), st.sampled_from(DEVICES), st.booleans()),
        st.tuples(st.just("prune"), st.integers(1, 3)),
        st.tuples(st.just("merge"), st.sampled_from(DEVICES), st.integers(-3000, 0), st.booleans()),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_the_report_from_a_kept_one_is_the_computed_report_under_any_interleaving(ops: list[tuple]) -> None:
    """Scans (now, or forwarded late with old times; failing or not), the clock moving on (the window's start
    with it, over old evidence and past midnights), refreshes, quarantines and releases, incidents (training
    ``slow`` ones and suspects), prunes, merges of a node's store (its scans, a device's new host; merged again
    with nothing new): after each, the report from the kept one, where it is used, equals the
    computed report byte for byte, for a window and for all time."""
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "f.db") as store:
        clock = NOW - 2 * DAY_S + 3600  # the oldest evidence leaves the 2-day window within the first hours
        for i, d in enumerate(DEVICES):
            _scan(store, d, NOW - 2 * DAY_S + 1800 + 600 * i, failed=i % 3 == 0)
        clock = NOW
        _refresh(store, clock)
        for op in ops:
            if op[0] == "scan":
                _scan(store, op[1], clock + op[2] * 60, failed=op[3])
            elif op[0] == "late":
                _scan(store, op[1], clock + op[2] * 60, failed=op[3])
            elif op[0] == "tick":
                clock += op[1] * 60
            elif op[0] == "refresh":
                _refresh(store, clock)
            elif op[0] == "quarantine" and store.quarantine.status(op[1], now=clock) != "quarantined":
                store.quarantine.add(op[1], reason="test", now=clock)
            elif op[0] == "release" and store.quarantine.status(op[1], now=clock) == "quarantined":
                store.quarantine.release(op[1], reason="test", now=clock)
            elif op[0] == "incident":
                kind = SLOW_KIND if op[2] else "replay"
                store.training.record_incident(
                    Incident(kind=kind, step=1, suspect_ranks=(0,), device=op[1], detail="test", time=clock - 60)
                )
            elif op[0] == "prune":
                store.maintenance.prune(before=clock - op[1] * DAY_S)
            elif op[0] == "merge":  # a node's store: a scan of its own (the same node's, merged again: nothing)
                with Store.open(Path(tmp) / "node.db") as node:
                    _scan(node, op[1], clock + op[2] * 60, failed=op[3])
                    if op[3]:
                        node.scans.record_devices([DeviceInfo(id=op[1], host=f"moved{op[2]}", kind="cpu")], now=clock)
                merge_stores(Path(tmp) / "f.db", [Path(tmp) / "node.db"])
            for w in WINDOWS:
                since = None if w is None else clock - w
                kept, computed = _both(store, since, clock)
                if kept is not None:
                    assert kept.json() == computed, op


def test_the_cli_reads_the_kept_report_and_says_the_same(tmp_path: Path) -> None:
    db = str(tmp_path / "f.db")
    with Store.open(db) as store:
        _fleet(store, NOW - 5 * 3600)
    runner = CliRunner()
    before = {f: runner.invoke(cli, ["--db", db, "report", "--format", f]) for f in ("json", "csv", "table")}
    refreshed = runner.invoke(cli, ["--db", db, "db", "refresh"])
    assert refreshed.exit_code == 0, refreshed.output
    assert "kept the report of 6 devices over 7d" in refreshed.output
    with Store.open(db) as store:
        assert store.summaries.kept_with_body(f"report.{round(7 * DAY_S)}") is not None
    for f, out in before.items():
        after = runner.invoke(cli, ["--db", db, "report", "--format", f])
        assert after.exit_code == 0 and out.exit_code == 0
        if f == "json":  # the verdicts' stamp: kept ones now, computed ones before
            a = [{k: v for k, v in r.items() if k != "slow_judged_at"} for r in json.loads(after.output)]
            b = [{k: v for k, v in r.items() if k != "slow_judged_at"} for r in json.loads(out.output)]
            assert a == b and all(r["slow_judged_at"] for r in json.loads(after.output))
        elif f == "table":
            assert after.output == out.output
    kept = runner.invoke(cli, ["--db", db, "report", "--format", "json"])
    computed = runner.invoke(cli, ["--db", db, "report", "--format", "json", "--computed"])
    assert kept.exit_code == computed.exit_code == 0 and kept.output == computed.output  # the same kept verdicts
