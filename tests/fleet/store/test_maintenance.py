"""Retention: ``prune`` rolls old scans into daily counts; every figure over whole days stays exactly the same."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.report.devices import build_report
from sdcguard.fleet.store.store import Store
from tests._fleet import result, snapshot

DAY = 86400.0
START = 20_000 * DAY  # a UTC midnight


def _history(path: Path, days: int = 40, seed: int = 1) -> None:
    rng = random.Random(seed)
    with Store.open(path) as store:
        for day in range(days):
            for dev in ("sim:1", "sim:2", "sim:3"):
                t = START + day * DAY + rng.uniform(0, DAY - 200)
                sid = store.scans.begin(device=dev, host="node", budget_s=60.0, started_at=t)
                rows = [
                    result(
                        dev,
                        t=t + i,
                        case=f"alu.{i % 3}",
                        family="alu" if i % 2 else "gemm",
                        duration_s=rng.randint(1, 64) / 64,
                    )
                    for i in range(20)
                ]
                if dev == "sim:3" and rng.random() < 0.3:
                    rows.append(result(dev, passed=False, t=t + 30, sticky=False))
                    rows.append(result(dev, passed=True, attempt=1, t=t + 31))
                status = "complete" if rng.random() < 0.9 else "preempted"
                store.scans.record(sid, rows, finish=status, finished_at=t + 60)
        store.scans.begin(device="sim:1", host="node", budget_s=60.0, started_at=START + 2 * DAY)  # left running


def _figures(store: Store, since: float | None) -> tuple:
    tallies = tuple(store.counts.tallies(since=since, by="device_family"))
    counts = {d: (c.complete, c.last_complete) for d, c in store.counts.scans(since=since).items()}
    report = tuple(
        (r.device, r.overall.executions, r.overall.failures, r.overall.test_hours, r.scans, r.status, r.last_scan)
        for r in build_report(store, since=since, families=True)
    )
    series = tuple(  # day bins: the fleet's read from rollup_days
        store.counts.series(start=since or START, width_s=DAY, devices=devices)
        for devices in (None, ["sim:1", "sim:3"])
    )
    return tallies, counts, report, store.failures.devices(since=since), series


def test_prune_keeps_every_figure_over_whole_days(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    _history(path)
    windows = [None, START, START + 10 * DAY, START + 25 * DAY, START + 39 * DAY]
    with Store.open(path) as store:
        before = {w: _figures(store, w) for w in windows}
        rows_before = store.maintenance.row_count("results")
        stats = store.maintenance.prune(before=START + 20 * DAY + 3600)  # rounded down to the midnight
        assert stats.before == START + 20 * DAY and stats.scans == 3 * 20 and stats.rollup_rows > 0
        assert store.maintenance.pruned_before == START + 20 * DAY
        for w in windows:
            assert _figures(store, w) == before[w], w
        assert store.maintenance.row_count("results") < rows_before
        assert min(r.started_at for r in store.scans.results()) >= START + 20 * DAY
        # the running scan is not anyone's to roll up
        assert [s["status"] for s in store.scans.history() if s["started_at"] < START + 20 * DAY] == ["running"]
        again = store.maintenance.prune(before=START + 20 * DAY)
        assert (again.scans, again.results) == (0, 0)
        for w in windows:
            assert _figures(store, w) == before[w], w


def test_a_merge_after_a_prune_counts_nothing_twice(tmp_path: Path) -> None:
    node, fleet = tmp_path / "node.db", tmp_path / "fleet.db"
    _history(node, days=30)
    merge_stores(fleet, [node])
    with Store.open(fleet) as store:
        whole = store.counts.tallies(by="device")
        store.maintenance.prune(before=START + 15 * DAY)
    for full in (False, True):
        (stats,) = merge_stores(fleet, [node], full=full)
        assert stats.results == 0
    with Store.open(fleet) as store:
        assert store.counts.tallies(by="device") == whole
    assert stats.skipped_scans == 3 * 15


def test_prune_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    _history(path, days=3)
    before = snapshot(path)
    for arg, words in (("3d", "shorter than 7 days"), ("banana", "not a duration")):
        r = CliRunner().invoke(cli, ["--db", str(path), "prune", "--before", arg])
        assert r.exit_code == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.output
    assert snapshot(path) == before
    r = CliRunner().invoke(cli, ["--db", str(path), "prune", "--before", "7d", "--vacuum"])
    assert r.exit_code == 0 and "rolled up" in r.stdout and "vacuumed" in r.stdout, r.output
    with sqlite3.connect(path) as c:  # 20000 days after 1970 is long before 7 days ago: everything rolled up
        assert c.execute("SELECT COUNT(*) FROM scans WHERE status != 'running'").fetchone()[0] == 0
        assert c.execute("SELECT SUM(executions) FROM rollups").fetchone()[0] == 3 * 3 * 20


@pytest.mark.parametrize("cut", [0.0, 0.5])
def test_a_store_killed_while_pruning_is_consistent(tmp_path: Path, cut: float) -> None:
    """Prune works a day per transaction: stopping after any day leaves every execution counted once."""
    path = tmp_path / "fleet.db"
    _history(path, days=10)
    with Store.open(path) as store:
        whole = store.counts.tallies(by="device")
        store.maintenance.prune(before=START + (4 + 10 * cut) * DAY)  # a first prune, as if the next one was killed
        assert store.counts.tallies(by="device") == whole
        store.maintenance.prune(before=START + 8 * DAY)
        assert store.counts.tallies(by="device") == whole


def test_an_older_store_gains_the_fleet_day_roll_ups(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    _history(path, days=12)
    with Store.open(path) as store:
        store.maintenance.prune(before=START + 8 * DAY)
        series = store.counts.series(start=START, width_s=DAY, devices=None)
    with sqlite3.connect(path) as conn:  # as a version-5 sdcguard left it: roll-ups per device, none per day
        conn.execute("DROP TABLE rollup_days")
        conn.execute("PRAGMA user_version = 5")
    with Store.open(path) as store:
        assert store.counts.series(start=START, width_s=DAY, devices=None) == series
        assert sum(p.executions for p in series[:8]) > 0


def test_interrupted_scans_are_pruned_and_rolled_up_like_complete_ones(tmp_path: Path) -> None:
    """A scan a killed scanner left behind (marked interrupted) is final: prune rolls its executions up and
    deletes its rows, and a merge does not read it again for ever."""
    path = tmp_path / "node.db"
    with Store.open(path) as store:
        for day, status in enumerate(("interrupted", "complete", "interrupted")):
            t = START + day * DAY
            sid = store.scans.begin(device="sim:1", host="node", budget_s=60.0, started_at=t)
            rows = [result("sim:1", t=t + i) for i in range(4)]
            store.scans.record(sid, rows, finish=status, finished_at=t + 60)
        sid = store.scans.begin(device="sim:1", host="node", budget_s=60.0, started_at=START + DAY + 5)
        store.scans.record(sid, [result("sim:1", t=START + DAY + 6)])  # still running: left alone
        whole = store.counts.tallies(by="device")
        stats = store.maintenance.prune(before=START + 10 * DAY)
        assert stats.scans == 3 and stats.results == 3
        assert [s["status"] for s in store.scans.history()] == ["running"]
        assert store.counts.tallies(by="device") == whole == [whole[0]] and whole[0].executions == 13
        assert store.counts.scans(since=None)["sim:1"].complete == 1  # interrupted never counts as complete


def test_a_pruned_scans_id_is_never_given_again(tmp_path: Path) -> None:
    """SQLite gives a deleted top rowid to the next row; a merge's watermark would take the new scan for the pruned
    one it already rolled up. A prune keeps the highest id given, and the next scan's id is above it."""
    path = tmp_path / "n.db"
    with Store.open(path) as store:
        sid = store.scans.begin(device="sim:1", host="n", budget_s=60.0, started_at=START)
        store.scans.record(sid, [result("sim:1", t=START + 1)], finish="complete", finished_at=START + 60)
        store.maintenance.prune(before=START + 3 * DAY)
        assert store.maintenance.row_count("scans") == 0
        again = store.scans.begin(device="sim:1", host="n", budget_s=60.0, started_at=START + 4 * DAY)
        assert again > sid
