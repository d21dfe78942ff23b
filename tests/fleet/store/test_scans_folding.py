"""Folding passing executions into one row per (scan, case) changes no figure; older stores migrate forward.

The reference is the per-execution computation: every execution its own record, counted in Python. Durations are
multiples of 1/64 s, so sums are exact in any order and test-hours can be compared for equality."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.fleet.rates import clopper_pearson, device_rates, fleet_rates
from sdcguard.fleet.report.devices import build_report
from sdcguard.fleet.store.schema.migrations import SQLITE_MIGRATIONS
from sdcguard.fleet.store.schema.tables import APPLICATION_ID
from sdcguard.fleet.store.store import Store
from sdcguard.records import CaseResult

CASES = {"gemm.a": "gemm", "gemm.b": "gemm", "alu.a": "alu"}


T0 = 1_800_000_000.0


@dataclass(frozen=True)
class Execution:
    device: str
    scan: int
    case: str
    passed: bool
    attempt: int
    duration_s: float
    started_at: float

    def result(self) -> CaseResult:
        return CaseResult(
            device=self.device,
            case=self.case,
            family=CASES[self.case],
            seed=len(self.case),
            passed=self.passed,
            duration_s=self.duration_s,
            started_at=self.started_at,
            attempt=self.attempt,
            output_digest="ok" if self.passed else f"bad-{self.device}-{self.started_at}",
            element=None if self.passed else 1,
            sticky=None,
        )


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, float, list[Execution], list[int]]]:
    """Scans (device, index, start, executions, batch cut points), scans disjoint in time."""
    scans = []
    for s in range(draw(st.integers(1, 6))):
        device = draw(st.sampled_from(["sim:0", "sim:1"]))
        start = T0 + 1000.0 * s
        runs: list[Execution] = []
        t = start
        for _ in range(draw(st.integers(0, 25))):
            case = draw(st.sampled_from(sorted(CASES)))
            passed = draw(st.integers(0, 5)) > 0
            runs.append(Execution(device, s, case, passed, 0, draw(st.integers(1, 64)) / 64, t))
            t += 1.0
            if not passed:
                for a in range(1, draw(st.integers(0, 2)) + 1):
                    runs.append(Execution(device, s, case, draw(st.booleans()), a, draw(st.integers(1, 64)) / 64, t))
                    t += 1.0
        cuts = sorted(draw(st.lists(st.integers(0, len(runs)), max_size=3)))
        scans.append((device, s, start, runs, cuts))
    return scans


def _reference(runs: list[Execution], since: float | None, key: str) -> dict[tuple[str, ...], tuple[int, int, float]]:
    out: dict[tuple[str, ...], list[float]] = {}
    for e in runs:
        if since is not None and e.started_at < since:
            continue
        k = {"device": (e.device,), "device_family": (e.device, CASES[e.case]), "family": (CASES[e.case],)}[key]
        acc = out.setdefault(k, [0, 0, 0.0])
        if e.attempt == 0:
            acc[0] += 1
            acc[1] += not e.passed
        acc[2] += e.duration_s
    return {k: (int(v[0]), int(v[1]), v[2]) for k, v in out.items()}


def _record(path: Path, scans: list[tuple[str, int, float, list[Execution], list[int]]]) -> None:
    with Store.open(path) as store:
        for device, _, start, runs, cuts in scans:
            sid = store.scans.begin(device=device, host="h", budget_s=60.0, started_at=start)
            bounds = [0, *cuts, len(runs)]
            for lo, hi in zip(bounds, bounds[1:]):
                store.scans.record(sid, [e.result() for e in runs[lo:hi]])
            store.scans.finish(sid, "complete", finished_at=start + 100)


@settings(max_examples=40)
@given(histories(), st.integers(0, 6))
def test_folded_rows_give_the_per_execution_rates_bounds_and_test_hours(
    tmp_path_factory: pytest.TempPathFactory, scans: list, window: int
) -> None:
    path = tmp_path_factory.mktemp("agg") / "s.db"
    _record(path, scans)
    runs = [e for *_, rs, _ in scans for e in rs]
    since = None if window == 0 else T0 + 1000.0 * (window - 1)  # a window boundary between two scans
    with Store.open(path, create=False) as store:
        for by in ("device", "device_family", "family"):
            got = {
                tuple(x for x in (t.device, t.family) if x is not None): (t.executions, t.failures, t.test_s)
                for t in store.counts.tallies(since=since, by=by)
            }
            assert got == _reference(runs, since, by)
        rates = device_rates(store, since=since, confidence=0.9)
        for (device,), (n, k, secs) in _reference(runs, since, "device").items():
            r = rates[device].overall
            assert (r.executions, r.failures, r.test_hours) == (n, k, secs / 3600.0)
            assert (r.rate_low, r.rate_high) == clopper_pearson(k, n, 0.9)
        fleet = fleet_rates(store, since=since)
        ref = _reference(runs, since, "family")
        assert fleet.overall.executions == sum(v[0] for v in ref.values())
        assert fleet.overall.failures == sum(v[1] for v in ref.values())
        # rows: one per (scan, case) with a passing first attempt, one per failure or retest
        rows = store.scans.results()
        passing = {(e.scan, e.case) for e in runs if e.passed and e.attempt == 0}
        assert len(rows) == len(passing) + sum(1 for e in runs if not e.passed or e.attempt)


def test_a_scan_grows_the_store_by_its_cases_not_its_executions(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        sid = store.scans.begin(device="sim:0", host="h", budget_s=60.0, started_at=T0)
        for batch in range(40):  # 40 flushes of 250 executions over 3 cases
            store.scans.record(
                sid,
                [
                    Execution("sim:0", 0, sorted(CASES)[i % 3], True, 0, 0.015625, T0 + batch * 250 + i).result()
                    for i in range(250)
                ],
            )
        store.scans.finish(sid, "complete")
        rows = store.scans.results()
        assert len(rows) == 3 and sum(r.executions for r in rows) == 10_000
        first = {r.case: r for r in rows}["alu.a"]
        assert (first.started_at, first.last_started_at) == (T0, T0 + 39 * 250 + 249)


# ---------------------------------------------------------------------------------------------------- migration
def _v3_store(path: Path, runs: list[Execution]) -> None:
    """A schema-3 store as the previous sdcguard wrote it: one row per execution, scan counters over every row."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for v in (1, 2, 3):
        SQLITE_MIGRATIONS[v](conn)
    conn.execute("PRAGMA user_version = 3")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    for d in ("sim:0", "sim:1"):
        conn.execute(
            "INSERT INTO devices(id, host, kind, first_seen, last_seen) VALUES (?, 'h', 'sim', ?, ?)", (d, T0, T0)
        )
    scans = sorted({(e.scan, e.device) for e in runs})
    for s, d in scans:
        conn.execute(
            "INSERT INTO scans(id, uuid, device, host, started_at, finished_at, budget_s, status) "
            "VALUES (?, ?, ?, 'h', ?, ?, 60, 'complete')",
            (s + 1, f"u{s}", d, T0 + 1000 * s, T0 + 1000 * s + 99),
        )
    for seq, e in enumerate(runs):
        r = e.result()
        conn.execute(
            "INSERT INTO results(scan, seq, device, case_id, family, seed, passed, duration_s, started_at, "
            "output_digest, attempt, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '{}')",
            (
                e.scan + 1,
                seq,
                e.device,
                e.case,
                r.family,
                r.seed,
                int(e.passed),
                e.duration_s,
                e.started_at,
                r.output_digest,
                e.attempt,
            ),
        )
    conn.execute(
        "UPDATE scans SET executions = (SELECT COUNT(*) FROM results r WHERE r.scan = scans.id), "
        "failures = (SELECT COUNT(*) FROM results r WHERE r.scan = scans.id AND r.passed = 0)"
    )
    conn.execute(
        "INSERT INTO incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail, sticky, "
        "job, time) VALUES ('i1', 'replay', 7, '[1]', 'sim:1', '[\"sim:1\"]', '[\"h\"]', 'x', 1, 'j', ?)",
        (T0,),
    )
    conn.execute("INSERT INTO incident_devices(incident, device) VALUES (1, 'sim:1')")
    conn.execute("COMMIT")
    conn.close()


@settings(max_examples=15)
@given(histories())
def test_a_schema_3_store_migrates_with_every_number_unchanged(
    tmp_path_factory: pytest.TempPathFactory, scans: list
) -> None:
    path = tmp_path_factory.mktemp("mig") / "old.db"
    runs = [e for *_, rs, _ in scans for e in rs]
    _v3_store(path, runs)
    with Store.open(path) as store:  # migrates
        for by in ("device", "device_family", "family"):
            got = {
                tuple(x for x in (t.device, t.family) if x is not None): (t.executions, t.failures, t.test_s)
                for t in store.counts.tallies(by=by)
            }
            assert got == _reference(runs, None, by)
        report = {r.device: r for r in build_report(store, since=None)}
        for (device,), (n, k, secs) in _reference(runs, None, "device").items():
            assert (report[device].overall.executions, report[device].overall.failures) == (n, k)
            assert report[device].overall.test_hours == secs / 3600.0
            # a training incident naming the device makes it a suspect too (the store's one incident names sim:1)
            assert report[device].status == ("suspect" if k or device == "sim:1" else "healthy")
            assert report[device].scans == len({e.scan for e in runs if e.device == device})
        for scan in store.scans.history():
            mine = [e for e in runs if e.scan + 1 == scan["id"]]
            assert scan["executions"] == sum(e.attempt == 0 for e in mine)
            assert scan["failures"] == sum(e.attempt == 0 and not e.passed for e in mine)
            assert scan["total"] == len(mine)
        passing = {(e.scan, e.case) for e in runs if e.passed and e.attempt == 0}
        assert len(store.scans.results()) == len(passing) + sum(1 for e in runs if not e.passed or e.attempt)
        (inc,) = store.training.incidents()
        assert (inc.kind, inc.step, inc.suspect_ranks, inc.device, inc.sticky, inc.job) == (
            "replay",
            7,
            (1,),
            "sim:1",
            True,
            "j",
        )
        # the migrated store takes new scans like a fresh one
        sid = store.scans.begin(device="sim:0", host="h", budget_s=1.0, started_at=T0 + 10_000)
        store.scans.record(
            sid, [Execution("sim:0", 99, "alu.a", True, 0, 0.5, T0 + 10_000).result()], finish="complete"
        )
