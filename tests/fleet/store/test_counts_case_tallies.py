"""The slowness statistic's tallies: ``case_tallies`` (running totals per device, case and day) and ``case_totals``
always equal what the rows written add up to, the rows a prune deleted included, through every write (scan batches
that grow a case's row, across midnight; merges that replace rows; prunes of the fleet and of node stores), and
the slowness a report computes from them equals the one computed from the rows."""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from collections import defaultdict
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.slow import SlowSettings, judge_slow, peer_group
from sdcguard.fleet.slow_fleet import fleet_slowness
from sdcguard.fleet.store.rows import CaseTimes, CaseTiming
from sdcguard.fleet.store.schema.migrations import SQLITE_MIGRATIONS
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo
from tests._fleet import assert_tallies_match_rows, result

DAY = 86400.0
START = 20_000 * DAY  # a UTC midnight
SETTINGS = SlowSettings(min_executions=1, min_cases=2, min_peers=2, confidence=0.75, spread_z=0.5)
KEPT_AT = START + 30 * DAY
"""When the property test keeps the verdicts it computed (after every window it asks for)."""
"""Loose enough that a few random scans give verdicts of every basis."""

Ledger = dict[str, list[tuple[str, str, int, str, float, int, float]]]
"""Per store: the passing first-attempt rows its prunes deleted (device, case, scan, family, start, executions,
seconds)."""

_ROWS = (
    "SELECT r.device, r.case_id, r.scan, r.family, r.started_at, r.executions, r.duration_s FROM results r "
    "JOIN scans s ON s.id = r.scan WHERE r.passed = 1 AND r.attempt = 0"
)


def _held(path: Path, where: str = "", params: tuple[object, ...] = ()) -> list[tuple]:
    with closing(sqlite3.connect(path)) as c:
        return c.execute(_ROWS + where, params).fetchall()


def _prune(path: Path, before: float, ledger: Ledger) -> None:
    """Prune, remembering the rows it deletes (finished scans started before the horizon)."""
    horizon = math.floor(before / DAY) * DAY
    ledger.setdefault(str(path), []).extend(_held(path, " AND s.started_at < ? AND s.status != 'running'", (horizon,)))
    with Store.open(path) as s:
        s.maintenance.prune(before=before)


def _scan_uuids(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as c:
        return {u for (u,) in c.execute("SELECT uuid FROM scans")}


def _merge(fleet: Path, inputs: list[Path], ledger: Ledger, held: set[str]) -> None:
    """Merge, remembering the rows the merge rolls up at once: an input's finished scan new to the fleet that
    started before the fleet's horizon is merged and pruned in the same transaction (its executions count in the
    roll-ups and the tallies, its rows are never held). ``held``: the scans the fleet ever held (its prunes delete
    them); an input scan in neither it nor the fleet after the merge went straight to the roll-ups, so its rows go
    into the fleet's ledger, as a prune's do."""
    merge_stores(fleet, inputs)
    after = _scan_uuids(fleet)
    for node in inputs:
        with closing(sqlite3.connect(node)) as c:
            for (uuid,) in c.execute("SELECT uuid FROM scans ORDER BY id").fetchall():
                if uuid not in held and uuid not in after:
                    rows = c.execute(_ROWS + " AND s.uuid = ?", (uuid,)).fetchall()
                    ledger.setdefault(str(fleet), []).extend(rows)
                    held.add(uuid)
    held |= after


def _recorded(path: Path, ledger: Ledger) -> list[tuple]:
    return _held(path) + ledger.get(str(path), [])


def _expected_window(path: Path, ledger: Ledger, since: float | None) -> dict[tuple[str, str], tuple[int, float]]:
    """What ``case_times`` must give, from the rows: every execution ever recorded for all time; else, from the
    window's start (at the horizon when it starts before it), its whole days (rows held or pruned, by the day of
    their start) and its partial first day: the rows held from the start to midnight, or, when the rows held of
    that day before the start are fewer, the whole day less those."""
    with Store.open(path, create=False) as s:
        horizon = s.maintenance.pruned_before
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    taken: list[tuple] = []
    if since is None:
        chosen = _recorded(path, ledger)
    else:
        start = since if horizon is None or since >= horizon else horizon
        day = math.ceil(start / DAY)
        with closing(sqlite3.connect(path)) as c:
            count = "SELECT COUNT(*) FROM results WHERE started_at >= ? AND started_at < ?"
            after = c.execute(count, (start, day * DAY)).fetchone()[0]
            before = c.execute(count, ((day - 1) * DAY, start)).fetchone()[0] if day * DAY > start else 0
        if before < after:
            chosen = [r for r in _recorded(path, ledger) if int(r[4] / DAY) >= day - 1]
            taken = [r for r in _held(path) if (day - 1) * DAY <= r[4] < start]
        else:
            chosen = [r for r in _recorded(path, ledger) if int(r[4] / DAY) >= day]
            chosen += [r for r in _held(path) if start <= r[4] < day * DAY]
    for sign, rows in ((1, chosen), (-1, taken)):
        for device, case, _scan, _family, _t, n, secs in rows:
            out[(device, case)][0] += sign * n
            out[(device, case)][1] += sign * secs
    return {k: (int(n), s) for k, (n, s) in out.items() if n > 0}


def _got_window(times: CaseTimes) -> dict[tuple[str, str], tuple[int, float]]:
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for t in times.records():
        out[(t.device, t.case)][0] += t.executions
        out[(t.device, t.case)][1] += t.seconds
    return {k: (int(n), s) for k, (n, s) in out.items()}


def _assert_running_totals(path: Path, ledger: Ledger) -> None:
    """Every running total a window may read (at or after the horizon's eve) is the sum of every execution
    recorded up to its day, and the totals are each key's latest running total, bit for bit."""
    with closing(sqlite3.connect(path)) as c:
        tallies = c.execute("SELECT device, case_id, day, executions, seconds FROM case_tallies").fetchall()
        totals = {
            (d, k): (first, day, n, s)
            for d, k, first, day, n, s in c.execute(
                "SELECT device, case_id, first, day, executions, seconds FROM case_totals"
            )
        }
        horizon = c.execute("SELECT value FROM meta WHERE key = 'pruned_before'").fetchone()
    eve = None if horizon is None else int(float(horizon[0]) // DAY) - 1
    by_key: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for d, k, day, n, s in tallies:
        by_key[(d, k)].append((day, n, s))
    assert by_key.keys() == totals.keys()
    recorded = _recorded(path, ledger)
    for key, days in by_key.items():
        days.sort()
        assert (days[0][0], *days[-1]) == totals[key], (key, days, totals[key])  # first day, latest day and sums
        if eve is not None:  # before the horizon's eve: nothing (the latest moved to the eve, later changes too)
            assert all(day >= eve for day, _, _ in days), (key, eve, days)
        mine = [r for r in recorded if (r[0], r[1]) == key]
        for day in {eve or days[0][0], *(d for d, _, _ in days)}:
            if eve is not None and day < eve:
                continue
            floor = [x for x in days if x[0] <= day]
            want_n = sum(r[5] for r in mine if int(r[4] / DAY) <= day)
            want_s = sum(r[6] for r in mine if int(r[4] / DAY) <= day)
            assert (floor[-1][1:] if floor else (0, 0.0)) == (want_n, want_s), (key, day, days)


def _expected_slowness(path: Path, ledger: Ledger, since: float | None):  # type: ignore[no-untyped-def]
    """The verdicts from the rows: each device's times per case from :func:`_expected_window`, the history of the
    devices of small groups from their held rows per scan (as the store gives them), the same rule."""
    with Store.open(path, create=False) as s:
        devices = s.scans.devices()
    groups = {d.id: peer_group(d.kind, d.model, d.host) for d in devices}
    sizes = {g: sum(1 for x in groups.values() if x == g) for g in groups.values()}
    family = {r[1]: r[3] for r in _recorded(path, ledger)}
    window = _expected_window(path, ledger, since)
    means = [
        CaseTiming(device=d, case=c, family=family[c], scan=0, executions=n, seconds=t)
        for (d, c), (n, t) in sorted(window.items())
    ]
    per_scan: dict[tuple[str, int, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for d, c, scan, _f, t, n, secs in _held(path):
        if sizes[groups[d]] <= SETTINGS.min_peers and (since is None or t >= since):
            per_scan[(d, scan, c)][0] += n
            per_scan[(d, scan, c)][1] += secs
    history = [
        CaseTiming(device=d, case=c, family=family[c], scan=scan, executions=int(n), seconds=t)
        for (d, scan, c), (n, t) in per_scan.items()
    ]
    return judge_slow(means, groups, SETTINGS, history=history)


# ("scan", node, device, [(hour offset, passed, case, attempt)...] batches, finish?), ("more", node, ...): another
# batch (and maybe the end) of the node's latest scan still running, now; ("merge",), ("prune", node or 2 = the
# fleet, days kept)
_batch = st.lists(
    st.tuples(st.integers(0, 60), st.booleans(), st.integers(0, 3), st.integers(0, 1)), min_size=1, max_size=6
)
_scan = st.tuples(
    st.just("scan"), st.integers(0, 1), st.integers(0, 3), st.lists(_batch, min_size=1, max_size=3), st.booleans()
)
_op = st.one_of(
    _scan,
    _scan,
    st.tuples(st.just("more"), st.integers(0, 1), st.just(0), st.lists(_batch, min_size=1, max_size=1), st.booleans()),
    st.tuples(st.just("merge"), st.just(0), st.just(0), st.just([]), st.just(False)),
    st.tuples(st.just("prune"), st.sampled_from([0, 1, 2, 2]), st.integers(1, 3), st.just([]), st.just(False)),
)


def _batch_results(device: str, clock: float, batch: list[tuple[int, bool, int, int]], speed: int) -> list:
    """Every case passing once at the batch's first hour, then the batch's own executions; dyadic times (the
    device's speed x the case's), so that sums are exact in any order."""
    first = [(batch[0][0], True, c, 0) for c in range(4)]
    return [
        result(
            device,
            passed=p,
            t=clock + h * 3600.0,
            case=f"c{c}",
            family=f"f{c % 2}",
            attempt=a,
            duration_s=speed * (c + 1) / 64,
        )
        for h, p, c, a in first + batch
    ]


_ONE = [[(0, False, 0, 0)]]
LATE_SCAN_ROLLED_UP_BY_A_MERGE = [
    *[("scan", 0, 0, _ONE, False)] * 4,
    ("merge", 0, 0, [], False),
    ("scan", 0, 0, _ONE, False),
    ("scan", 0, 0, _ONE, True),  # finished on the node: the fleet's horizon will pass it before it is merged
    ("scan", 0, 0, _ONE, False),
    ("more", 0, 0, _ONE, False),
    ("prune", 2, 1, [], False),
    ("merge", 0, 0, [], False),
]
"""CI's counterexample (seed 63188919736230325467082166784285073199, shrunk): the merge after the fleet's prune
brings a finished scan from before the horizon, which it rolls up at once; the tallies counted it and the test's
ledger did not (the store was right, the oracle missed rows a merge prunes)."""

_NOTHING = ("prune", 0, 1, [], False)  # node 0 is never written: a prune of it only moves the clock on
A_NEW_SCAN_PAST_A_WATERMARK_ITS_NODE_PRUNED = [
    ("scan", 1, 0, _ONE, True),  # scan id 1 on node 1
    ("merge", 0, 0, [], False),  # the fleet's watermark of node 1: scan id 1
    ("scan", 1, 0, _ONE, False),  # scan id 2, still running, never merged
    _NOTHING,
    ("prune", 1, 1, [], False),  # node 1 prunes scan 1: the row at the fleet's watermark is gone
    ("prune", 2, 1, [], False),
    _NOTHING,
    ("prune", 2, 1, [], False),  # the fleet's horizon passes scan 2's start
    ("merge", 0, 0, [], False),
]
"""The soak's counterexample (500 interleavings, shrunk by hand from 16 operations): the merge found the row at its
watermark pruned on the node, read the node in full, and took every scan that started before the fleet's horizon for
one already rolled up, so scan 2, which no merge had seen, was lost (the tallies and the roll-ups never counted it).
The store was wrong: an id above the remembered watermark is a scan no earlier merge saw, rewound or not."""


A_PRUNED_TOP_ID_GIVEN_AGAIN = [
    ("scan", 1, 0, _ONE, True),  # scan id 1 on node 1
    ("merge", 0, 0, [], False),  # the fleet's watermark of node 1: scan id 1
    _NOTHING,
    _NOTHING,
    ("prune", 1, 1, [], False),  # node 1 prunes scan 1, its newest
    ("scan", 1, 0, _ONE, True),  # a new scan: SQLite gave it id 1 again
    _NOTHING,
    _NOTHING,
    _NOTHING,
    ("prune", 2, 1, [], False),
    ("prune", 2, 1, [], False),  # the fleet's horizon passes the new scan's start
    ("merge", 0, 0, [], False),
]
"""A counterexample found beside the one above (helper's search, not CI's): node 1 pruned its newest scan and gave
its id to the next one, which the merge took for the scan at its watermark, already rolled up: lost. The store was
wrong: a SQLite store now never gives an id twice (a prune keeps the highest it gave: ``meta.scan_id_floor``)."""


def _tallies_property(examples: int):  # type: ignore[no-untyped-def]
    """The property below over ``examples`` interleavings, the counterexamples found so far always among them."""
    return lambda test: settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )(
        example(ops=LATE_SCAN_ROLLED_UP_BY_A_MERGE, since_offsets=[0.0, 0.0], speed=[1] * 8)(
            example(ops=A_NEW_SCAN_PAST_A_WATERMARK_ITS_NODE_PRUNED, since_offsets=[0.0, 0.0], speed=[1] * 8)(
                example(ops=A_PRUNED_TOP_ID_GIVEN_AGAIN, since_offsets=[0.0, 0.0], speed=[1] * 8)(
                    given(
                        st.lists(_op, min_size=6, max_size=18),
                        st.lists(st.floats(0, 6 * DAY), min_size=2, max_size=2),
                        st.lists(st.sampled_from([1, 2, 3]), min_size=8, max_size=8),
                    )(test)
                )
            )
        )
    )


@_tallies_property(40)
def test_the_slowness_from_tallies_equals_the_slowness_from_rows(
    tmp_path_factory: pytest.TempPathFactory, ops, since_offsets, speed
) -> None:
    _slowness_from_tallies_equals_rows(tmp_path_factory, ops, since_offsets, speed)


@pytest.mark.slow
@pytest.mark.soak
@_tallies_property(500)
def test_the_slowness_from_tallies_equals_the_slowness_from_rows_over_500_interleavings(
    tmp_path_factory: pytest.TempPathFactory, ops, since_offsets, speed
) -> None:
    """The same property at 500 examples (about two minutes on a 2-core machine): `pytest -m slow` or `-m soak`."""
    _slowness_from_tallies_equals_rows(tmp_path_factory, ops, since_offsets, speed)


def _slowness_from_tallies_equals_rows(
    tmp_path_factory: pytest.TempPathFactory,
    ops,
    since_offsets,
    speed,  # type: ignore[no-untyped-def]
) -> None:
    d = tmp_path_factory.mktemp("cases")
    nodes = [d / "n0.db", d / "n1.db"]
    fleet = d / "fleet.db"
    ledger: Ledger = {}
    held: set[str] = set()
    clock = START
    for kind, n, dev, batches, finish in ops:
        clock += 0.4 * DAY
        if kind == "scan":
            with Store.open(nodes[n]) as s:
                device = f"cpu:n{n}:{dev}"
                s.scans.record_devices(
                    [DeviceInfo(id=device, host=f"n{n}", kind="cpu", model="Xeon" if dev else None)], now=clock
                )
                sid = s.scans.begin(device=device, host=f"n{n}", budget_s=60.0, started_at=clock)
                for batch in batches:  # hours apart: a case's folded row grows across midnight
                    s.scans.record(sid, _batch_results(device, clock, batch, speed[4 * n + dev]))
                if finish:
                    s.scans.finish(sid, "complete", finished_at=clock + 61 * 3600.0)
        elif kind == "more" and nodes[n].exists():
            with closing(sqlite3.connect(nodes[n])) as c:
                running = c.execute(
                    "SELECT id, device FROM scans WHERE status = 'running' ORDER BY id DESC LIMIT 1"
                ).fetchone()
            if running is not None:  # its rows of a case grow, days after they started (a prune between)
                sid, device = running
                with Store.open(nodes[n]) as s:
                    s.scans.record(
                        sid,
                        _batch_results(device, clock, batches[0], speed[4 * n + int(device[-1])]),
                        finish="complete" if finish else None,
                        finished_at=clock + DAY,
                    )
        elif kind == "merge":
            existing = [p for p in nodes if p.exists()]
            if existing:
                _merge(fleet, existing, ledger, held)
        elif kind == "prune":
            path = fleet if n == 2 else nodes[n]
            if path.exists():
                _prune(path, clock - dev * DAY, ledger)
    for path in [*nodes, fleet]:
        if not path.exists():
            continue
        assert_tallies_match_rows(path)
        _assert_running_totals(path, ledger)
        for since in [None, *(START + x for x in since_offsets), START + 3 * DAY]:
            with Store.open(path, create=False) as s:
                assert _got_window(s.counts.case_times(since=since)) == _expected_window(path, ledger, since), since
                got = fleet_slowness(s, since=since, settings=SETTINGS, now=KEPT_AT, keep=True)
                kept = fleet_slowness(s, since=since, settings=SETTINGS, now=KEPT_AT, max_age_s=1.0)
            assert got == _expected_slowness(path, ledger, since), since
            # kept in the store and read back: the same verdicts to the bit, stamped with when they were computed
            assert {d: dataclasses.replace(v, judged_at=None) for d, v in kept.items()} == got, since
            assert all(v.judged_at == KEPT_AT for v in kept.values()), since


def test_a_scan_running_across_the_horizon_changes_the_running_total_on_the_horizons_eve(tmp_path: Path) -> None:
    node, fleet = tmp_path / "n.db", tmp_path / "fleet.db"
    device = "cpu:n:0"
    with Store.open(node) as s:
        long = s.scans.begin(device=device, host="n", budget_s=None, started_at=START)
        s.scans.record(long, [result(device, t=START + 60, case="c0", duration_s=1 / 4)])
        short = s.scans.begin(device=device, host="n", budget_s=60.0, started_at=START + DAY)
        s.scans.record(short, [result(device, t=START + DAY + 60, case="c0", duration_s=1 / 8)], finish="complete")
        other = s.scans.begin(device="cpu:n:1", host="n", budget_s=60.0, started_at=START + 2 * DAY)
        s.scans.record(other, [result("cpu:n:1", t=START + 2 * DAY, case="c0")], finish="complete")
    merge_stores(fleet, [node])
    ledger: Ledger = {}
    _prune(fleet, START + 3 * DAY, ledger)  # the short scans go (days 1 and 2), the long one (running) stays
    with Store.open(node) as s:  # the long scan's row of day 0 grows, three days on
        s.scans.record(
            long,
            [result(device, t=START + 3.5 * DAY, case="c0", duration_s=1 / 2)],
            finish="complete",
            finished_at=START + 3.6 * DAY,
        )
    merge_stores(fleet, [node])
    with closing(sqlite3.connect(fleet)) as c:
        days = c.execute(
            "SELECT day, executions, seconds FROM case_tallies WHERE device = ? ORDER BY day", (device,)
        ).fetchall()
    assert days == [(20_002, 3, 1 / 4 + 1 / 8 + 1 / 2)]  # day 1's running total moved to the eve, and the change
    _assert_running_totals(fleet, ledger)
    with Store.open(fleet) as s:
        assert _got_window(s.counts.case_times(since=None))[(device, "c0")] == (3, 7 / 8)
        assert _got_window(s.counts.case_times(since=START + 3 * DAY)) == {}  # it all started before the horizon


def _fill(path: Path) -> None:
    with Store.open(path) as s:
        for i in range(3):
            for dev in range(4):
                device = f"cpu:h:{dev}"
                s.scans.record_devices([DeviceInfo(id=device, host="h", kind="cpu", model="Xeon")], now=START)
                sid = s.scans.begin(device=device, host="h", budget_s=60.0, started_at=START + i * DAY + dev)
                s.scans.record(
                    sid,
                    [
                        result(
                            device,
                            t=START + i * DAY + dev + j,
                            case=f"c{j % 5}",
                            passed=j != 7,
                            duration_s=(1 + dev) * (1 + j % 5) / 64,
                        )
                        for j in range(12)
                    ],
                    finish="complete",
                )


def test_an_older_store_gains_its_case_tallies_and_the_migration_can_run_again(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    _fill(path)
    with Store.open(path) as s:
        want = _got_window(s.counts.case_times(since=START + 0.5 * DAY))
        verdicts = fleet_slowness(s, since=START + 0.5 * DAY, settings=SETTINGS)
    with closing(sqlite3.connect(path)) as c, c:  # as schema 9 left it
        c.execute("DROP TABLE case_tallies")
        c.execute("DROP TABLE case_totals")
        c.execute("DROP INDEX results_time")
        c.execute("CREATE INDEX results_time ON results(started_at, device, family, executions, duration_s)")
        c.execute("PRAGMA user_version = 9")
    with Store.open(path) as s:
        assert _got_window(s.counts.case_times(since=START + 0.5 * DAY)) == want
        assert fleet_slowness(s, since=START + 0.5 * DAY, settings=SETTINGS) == verdicts
    _assert_running_totals(path, {})
    with closing(sqlite3.connect(path)) as c, c:  # once more over a schema-10 store: the same tallies
        before = [c.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall() for t in ("case_tallies", "case_totals")]
        SQLITE_MIGRATIONS[10](c)
        assert [
            c.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall() for t in ("case_tallies", "case_totals")
        ] == before
    _assert_running_totals(path, {})


def test_pruned_rows_keep_their_tallies_and_a_window_before_the_horizon_counts_from_it(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    _fill(path)  # days 0, 1 and 2: 11 passing executions of 5 cases per device a day
    with Store.open(path) as s:
        s.maintenance.prune(before=START + 2 * DAY)  # days 0 and 1 go
        assert s.maintenance.row_count("results") == 4 * 6  # a row per case passed, one per failure
        everything = _got_window(s.counts.case_times(since=None))
        assert sum(n for n, _ in everything.values()) == 3 * 4 * 11
        from_horizon = _got_window(s.counts.case_times(since=START + 2 * DAY))
        assert sum(n for n, _ in from_horizon.values()) == 4 * 11
        assert _got_window(s.counts.case_times(since=START + 0.5 * DAY)) == from_horizon
