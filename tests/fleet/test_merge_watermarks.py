"""Merges that lose nothing when a node store goes backwards: its newest scans pruned (SQLite reuses their ids),
the file deleted and recreated, or restored from an older backup; and training incidents of many jobs on many
nodes collected through the merge, none lost, none twice."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, assert_tallies_match_rows, result
from tests.conftest import BACKENDS

DAY = 86400.0


def _scan(path: Path, device: str, n: int, t: float) -> str:
    """One complete scan of ``n`` passing executions at ``t``; returns its uuid."""
    with Store.open(path) as s:
        sid = s.scans.begin(device=device, host=path.stem, budget_s=60.0, started_at=t)
        s.scans.record(
            sid,
            [result(device, t=t + i, case=f"alu.{i}", family="alu") for i in range(n)],
            finish="complete",
            finished_at=t + 60,
        )
        (row,) = [r for r in s.scans.history() if r["id"] == sid]
        return str(row["uuid"])


def _executions(fleet: Path) -> dict[str, int]:
    with Store.open(fleet, create=False) as s:
        return {t.device: t.executions for t in s.counts.tallies(by="device")}


def _backup(src: Path, dst: Path) -> None:
    """A consistent copy of a live store, as a backup tool (sqlite3 .backup) makes it."""
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()


def _restore(backup: Path, path: Path) -> None:
    """The store replaced by its backup (with the WAL and index files of the replaced one gone)."""
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    shutil.copyfile(backup, path)


def test_a_merge_after_a_node_prune_takes_the_scans_that_reused_old_ids(tmp_path: Path) -> None:
    """The issue's reproduction: 3 old scans merged, the node pruned, a new scan is not lost (it was given id 1 again
    then; a SQLite store now never gives an id twice, and the merge takes it either way)."""
    node, fleet = tmp_path / "node.db", tmp_path / "fleet.db"
    for i in range(3):
        _scan(node, "sim:1", 2, NOW - 20 * DAY + i)
    (first,) = merge_stores(fleet, [node])
    assert first.scans == 3 and first.rewound == ()
    with Store.open(node) as s:
        assert s.maintenance.prune(before=NOW - 10 * DAY).scans == 3
    _scan(node, "sim:1", 7, NOW - DAY)
    with Store.open(node) as s:
        assert [r["id"] for r in s.scans.history()] == [4]  # above every id given (it was 1, a merged scan's)
    (second,) = merge_stores(fleet, [node])
    assert second.scans == 1 and second.results == 7 and second.rewound == ("scans",)
    assert _executions(fleet) == {"sim:1": 3 * 2 + 7}
    (third,) = merge_stores(fleet, [node])  # the watermark is right again: nothing new, nothing read again
    assert third.scans == third.results == 0 and third.rewound == ()


def _case_executions(fleet: str) -> int:
    """Every execution the slowness statistic's running totals (the case tallies) count, for all time."""
    with Store.open(fleet, create=False) as s:
        return sum(t.executions for t in s.counts.case_times(since=None).records())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_merge_whose_watermark_the_node_pruned_takes_its_new_scans_from_before_the_fleets_horizon(
    tmp_path: Path, new_store: Callable[[str], str], backend: str
) -> None:
    """The node prunes the scan at the fleet's watermark, and the scans it recorded since (one running, one
    complete, never merged) started before the fleet's horizon by the next merge. That merge reads the node in full
    (the watermark's row is gone), and their ids above the watermark say no merge saw them: both are taken, the
    complete one rolled up at once. They were taken for scans already in the roll-ups and lost (found by the case
    tallies' soak property: A_NEW_SCAN_PAST_A_WATERMARK_ITS_NODE_PRUNED)."""
    node, fleet = tmp_path / "node.db", new_store(backend)
    day0 = 20_000 * DAY  # a UTC midnight
    _scan(node, "sim:1", 2, day0 + 3600)  # scan id 1: the fleet's watermark of the node
    merge_stores(fleet, [node])
    with Store.open(fleet) as s:
        s.maintenance.prune(before=day0 + DAY)  # the fleet rolls day 0 up
    with Store.open(node) as s:
        running = s.scans.begin(device="sim:1", host="node", budget_s=None, started_at=day0 + DAY + 3600)  # id 2
        s.scans.record(running, [result("sim:1", t=day0 + DAY + 3600, case=f"alu.{i}", family="alu") for i in range(3)])
    _scan(node, "sim:1", 5, day0 + DAY + 7200)  # id 3, complete
    with Store.open(node) as s:
        assert s.maintenance.prune(before=day0 + DAY).scans == 1  # scan 1 goes: the row at the watermark
    with Store.open(fleet) as s:
        s.maintenance.prune(before=day0 + 2 * DAY)  # nothing more to prune: the horizon passes scans 2 and 3
        assert s.maintenance.pruned_before == day0 + 2 * DAY
    (stats,) = merge_stores(fleet, [node])
    assert stats.rewound == ("scans",) and stats.scans == 2 and stats.skipped_scans == 0
    assert _executions(fleet) == {"sim:1": 2 + 3 + 5} and _case_executions(fleet) == 2 + 3 + 5
    with Store.open(fleet, create=False) as s:
        assert [r["status"] for r in s.scans.history()] == ["running"]  # the complete one is in the roll-ups
    with Store.open(node) as s:  # the running scan goes on and ends: taken again, each execution counted once
        s.scans.record(
            running,
            [result("sim:1", t=day0 + 2.5 * DAY, case=f"alu.{i}", family="alu") for i in range(4)],
            finish="complete",
            finished_at=day0 + 2.6 * DAY,
        )
    (stats,) = merge_stores(fleet, [node])
    assert stats.rewound == () and stats.scans == 0
    assert _executions(fleet) == {"sim:1": 2 + 7 + 5} and _case_executions(fleet) == 2 + 7 + 5
    if backend == "sqlite":
        assert_tallies_match_rows(fleet)


def test_a_deleted_and_recreated_node_store_loses_nothing(tmp_path: Path) -> None:
    node, fleet = tmp_path / "node.db", tmp_path / "fleet.db"
    for i in range(3):
        _scan(node, "sim:1", 2, NOW - 5 * DAY + i)
    merge_stores(fleet, [node])
    node.unlink()
    _scan(node, "sim:1", 5, NOW - DAY)  # a new store: another store id, merged whole
    merge_stores(fleet, [node])
    assert _executions(fleet) == {"sim:1": 3 * 2 + 5}


@pytest.mark.parametrize("new_scans", [1, 3])
def test_a_node_store_restored_from_a_backup_loses_nothing(tmp_path: Path, new_scans: int) -> None:
    """After a restore the node writes ids the fleet saw before: one new scan leaves the watermark's row missing,
    three put another scan at it. Both are noticed."""
    node, backup, fleet = tmp_path / "node.db", tmp_path / "backup.db", tmp_path / "fleet.db"
    for i in range(2):
        _scan(node, "sim:1", 2, NOW - 5 * DAY + i)
    _backup(node, backup)
    for i in range(2):
        _scan(node, "sim:1", 3, NOW - 4 * DAY + i)
    merge_stores(fleet, [node])  # watermark: scan id 4
    _restore(backup, node)
    for i in range(new_scans):
        _scan(node, "sim:1", 10, NOW - 2 * DAY + i)
    (stats,) = merge_stores(fleet, [node])
    assert stats.rewound == ("scans",) and stats.scans == new_scans
    assert _executions(fleet) == {"sim:1": 2 * 2 + 2 * 3 + 10 * new_scans}


def test_the_merge_says_when_an_input_went_backwards(tmp_path: Path) -> None:
    node, fleet = tmp_path / "node.db", tmp_path / "fleet.db"
    _scan(node, "sim:1", 2, NOW - 20 * DAY)
    merge_stores(fleet, [node])
    with Store.open(node) as s:
        s.maintenance.prune(before=NOW - 10 * DAY)
    _scan(node, "sim:1", 2, NOW - DAY)
    out = CliRunner().invoke(cli, ["merge", str(fleet), str(node)])
    assert out.exit_code == 0, out.output
    assert "+1 scans" in out.output and "went backwards" in out.output and "read in full" in out.output


def test_a_watermark_from_before_the_upgrade_is_read_in_full_once(tmp_path: Path) -> None:
    """A fleet store merged by an earlier sdcguard remembers ids without uuids: the first merge after the
    upgrade reads each input in full, and so recovers a scan an earlier merge skipped."""
    node, fleet = tmp_path / "node.db", tmp_path / "fleet.db"
    _scan(node, "sim:1", 2, NOW - DAY)
    merge_stores(fleet, [node])
    _scan(node, "sim:1", 4, NOW - DAY + 100)
    with closing(sqlite3.connect(fleet)) as c, c:  # as the old merge left it after skipping scan 2 (a reused id)
        c.execute("UPDATE merge_sources SET scans = 2, marks = '{}'")
    (stats,) = merge_stores(fleet, [node])
    assert "scans" in stats.rewound and stats.scans == 1
    assert _executions(fleet) == {"sim:1": 6}


# --- the property: any interleaving within the retention horizon ends with every recorded count in the fleet -----
_op = st.one_of(
    st.tuples(st.just("scan"), st.integers(0, 1), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("incident"), st.integers(0, 1), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("prune"), st.integers(0, 1), st.just(0), st.integers(0, 1)),
    st.tuples(st.just("merge"), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("backup"), st.integers(0, 1), st.just(0), st.just(0)),
    st.tuples(st.just("restore"), st.integers(0, 1), st.just(0), st.just(0)),
    st.tuples(st.just("recreate"), st.integers(0, 1), st.just(0), st.just(0)),
)


@dataclass
class _Node:
    """What one node store holds now (the model): scans ``uuid -> (device, executions, started_at)`` and
    incident uuids."""

    scans: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    incidents: set[str] = field(default_factory=set)
    backup: tuple[dict[str, tuple[str, int, float]], set[str]] | None = None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_op, max_size=25))
@example([("scan", 0, 0, 2), *[("merge", 0, 0, 0)] * 4, ("prune", 0, 0, 0), ("scan", 0, 0, 3), ("merge", 0, 0, 0)])
def test_the_fleet_holds_every_count_the_nodes_recorded(tmp_path_factory: pytest.TempPathFactory, ops) -> None:
    """Scans, incidents, prunes, backups, restores, deleted stores and merges in any order on two nodes: after a
    last merge the fleet's executions per device (and its scans and incidents) are exactly those of every scan
    and incident a node held at some merge or holds now, each counted once. (A scan pruned or lost on its node
    before any merge saw it was never the fleet's to count: node roll-ups are not merged.)"""
    d = tmp_path_factory.mktemp("prop")
    paths = [d / "node0.db", d / "node1.db"]
    fleet = d / "fleet.db"
    model = [_Node(), _Node()]
    seen_scans: dict[str, tuple[str, int]] = {}
    seen_incidents: set[str] = set()
    clock = [NOW - 6 * DAY]

    def merge() -> None:
        existing = [p for p in paths if p.exists()]
        if existing:
            merge_stores(fleet, existing)
        for m in model:
            seen_scans.update({u: (dev, n) for u, (dev, n, _) in m.scans.items()})
            seen_incidents.update(m.incidents)

    for kind, n, dev, size in ops:
        clock[0] += 0.25 * DAY
        path, m = paths[n], model[n]
        if kind == "scan":
            u = _scan(path, f"sim:{n}{dev}", size, clock[0])
            m.scans[u] = (f"sim:{n}{dev}", size, clock[0])
        elif kind == "incident":
            with Store.open(path) as s:
                iid = s.training.record_incident(
                    Incident(
                        kind="replay",
                        step=int(clock[0]),
                        suspect_ranks=(dev,),
                        device=f"sim:{n}{dev}",
                        detail="x",
                        devices=(f"sim:{n}{dev}",),
                        hosts=(f"node{n}",),
                        job=f"job{dev}",
                        time=clock[0],
                    )
                )
            with closing(sqlite3.connect(path)) as c:  # closed: a restore must not pull files from under it
                m.incidents.add(c.execute("SELECT uuid FROM incidents WHERE id = ?", (iid,)).fetchone()[0])
        elif kind == "prune" and path.exists():
            with Store.open(path) as s:
                horizon = s.maintenance.prune(before=clock[0] - size * DAY).before  # size 0: every scan before today
            m.scans = {u: v for u, v in m.scans.items() if v[2] >= horizon}
        elif kind == "merge":
            merge()
        elif kind == "backup" and path.exists():
            _backup(path, d / f"backup{n}.db")
            m.backup = (dict(m.scans), set(m.incidents))
        elif kind == "restore" and m.backup is not None:
            _restore(d / f"backup{n}.db", path)
            m.scans, m.incidents = dict(m.backup[0]), set(m.backup[1])
        elif kind == "recreate" and path.exists():
            for extra in ("", "-wal", "-shm"):
                Path(f"{path}{extra}").unlink(missing_ok=True)
            m.scans, m.incidents, m.backup = {}, set(), None
    merge()
    if not fleet.exists():
        return
    expected: dict[str, int] = {}
    for dev, n in seen_scans.values():
        expected[dev] = expected.get(dev, 0) + n
    assert _executions(fleet) == expected
    with Store.open(fleet, create=False) as s:
        assert {r["uuid"] for r in s.scans.history()} == set(seen_scans)
        assert len(s.training.incidents()) == len(seen_incidents)
    with closing(sqlite3.connect(fleet)) as c:
        assert {r[0] for r in c.execute("SELECT uuid FROM incidents")} == seen_incidents
    for path in [fleet, *paths]:
        if path.exists():
            assert_tallies_match_rows(path)  # the per-day tallies follow through restores and re-reads


# --- training incidents: node-local stores and per-job spools, collected by the merge ----------------------------
def _job(path: Path, job: str, node: str, incidents: int, start: float) -> None:
    """One training job's guard on one node: incidents and checkpoints into the node-local store (the guard's
    ``store=`` path), from its own thread and connection like a separate process."""
    with Store.open(path) as s:
        for k in range(incidents):
            dev = f"sim:{node}{k % 2}"
            s.training.record_incident(
                Incident(
                    kind="replay",
                    step=k,
                    suspect_ranks=(k % 2,),
                    device=dev,
                    detail=job,
                    devices=(dev,),
                    hosts=(node,),
                    job=job,
                    time=start + k,
                )
            )
            s.training.record_checkpoint(checkpoint_id=f"{job}/step{k}", step=k, verified=True, job=job, now=start + k)


def test_incidents_of_several_jobs_on_several_nodes_reach_the_fleet_once(tmp_path: Path) -> None:
    nodes = [tmp_path / f"node{i}.db" for i in range(3)]
    spools = [tmp_path / f"job-spool-{i}.db" for i in range(2)]  # jobs that write a store of their own
    fleet = tmp_path / "fleet.db"
    expected: set[tuple[str, int]] = set()
    for rnd in range(3):  # jobs come and go between merges
        threads = []
        for i, node in enumerate(nodes):
            for j in range(2):  # two jobs share each node's store at once
                job = f"job{rnd}.{i}.{j}"
                threads.append(threading.Thread(target=_job, args=(node, job, f"n{i}", 3, NOW - 100 * (rnd + 1))))
                expected |= {(job, k) for k in range(3)}
        for i, spool in enumerate(spools):
            job = f"spool{rnd}.{i}"
            threads.append(threading.Thread(target=_job, args=(spool, job, f"s{i}", 2, NOW - 50 * (rnd + 1))))
            expected |= {(job, k) for k in range(2)}
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        merge_stores(fleet, [*nodes, *spools])
        if rnd == 1:
            merge_stores(fleet, [*nodes, *spools])  # a merge job that ran twice
    with Store.open(fleet, create=False) as s:
        got = [(i.job, i.step) for i in s.training.incidents()]
        checkpoints = [(c.job, c.step) for c in s.training.checkpoints()]
    assert len(got) == len(expected) and set(got) == expected  # none lost, none twice
    assert len(checkpoints) == len(expected) and set(checkpoints) == expected


def test_merge_takes_directories_of_node_stores_and_job_spools(tmp_path: Path) -> None:
    """`sdcguard merge fleet.db nodes/ jobs/`: every *.db in each directory; an empty directory is no error (an
    unmatched shell glob would be a missing input)."""
    (tmp_path / "nodes").mkdir()
    (tmp_path / "jobs").mkdir()
    fleet = tmp_path / "fleet.db"
    out = CliRunner().invoke(cli, ["merge", str(fleet), str(tmp_path / "nodes"), str(tmp_path / "jobs")])
    assert out.exit_code == 0 and "nothing to merge" in out.output, out.output
    _scan(tmp_path / "nodes" / "n1.db", "sim:1", 3, NOW - DAY)
    _job(tmp_path / "jobs" / "4242.db", "4242", "n1", 2, NOW - 100)
    _job(tmp_path / "jobs" / "4243.db", "4243", "n2", 1, NOW - 50)
    for _ in range(2):
        out = CliRunner().invoke(cli, ["merge", str(fleet), str(tmp_path / "nodes"), str(tmp_path / "jobs")])
        assert out.exit_code == 0, out.output
    assert out.output.count("+0 incidents") == 3
    with Store.open(fleet, create=False) as s:
        assert sorted((i.job, i.step) for i in s.training.incidents()) == [("4242", 0), ("4242", 1), ("4243", 0)]
    assert _executions(fleet) == {"sim:1": 3}
