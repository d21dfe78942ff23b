"""Merging another store into this one (incrementally), pruning old scans into daily roll-ups, and the day
tallies that both keep exact.

**Merge.** Every row that can be merged has a natural key: a scan its ``uuid``, a result ``(scan uuid, seq)``, an
incident, a quarantine change, a policy decision and an action attempt their ``uuid``, an action
``(device, action, quarantined_since)``. A merge takes only what is new in an input since its last merge: the
output remembers, per input (its ``meta.store_id``), the highest row id it took of every append-only table *and
that row's uuid* (``merge_sources.marks``), and the scans that were still open (``running``, or ``interrupted``
lately: a scanner taken for dead may still finish one); those open scans are taken again, since their rows
still change (a passing row's count grows as the scan goes on). Row ids are SQLite rowids, reused once an input's
newest rows are pruned or the input is restored from an older backup: a watermark whose row is gone or is
another is reset to 0, that table read in full, and the merge says so (``MergeStats.rewound``). The input is the
authority for its own scans' rows, so taking one again changes nothing: merging the same input twice counts
nothing twice, with or without the watermark (``full=True`` ignores it). A device's quarantine state is
replayed from the merged history (the latest change wins). Each input is merged in one transaction, read
through ``ATTACH``, and never written.

**Prune.** Finished scans (``interrupted`` ones too; only ``running`` ones stay) that started before the horizon
(a UTC midnight) are rolled into per-day, per-device, per-family counts (``rollups``; the whole fleet's per day
in ``rollup_days``, summed from those; complete scans per day and device in ``scan_rollups``; both also summed
over all days in ``rollup_totals`` and ``scan_rollup_totals``, what an all-time report reads) and their rows
deleted, one day per transaction and one pass over the day's rows, so a store killed while pruning is
consistent. Every execution is counted once, in a row or in a roll-up; what is lost is the detail of each old
failure and the time resolution below a day. A later merge skips input scans older than the horizon: they are
already in the roll-ups.

**Day tallies.** ``day_tallies`` equals, at every commit, what the rows of ``results`` add up to per UTC day (of a
row's start), device and family: :class:`DayTallies` for a scan's batch (the store's write path), minus and plus
one pass over the rows a merge replaces and writes, minus what a prune deletes.

**Case tallies** (the slowness statistic's running totals per device, case and day, :mod:`.schema` version 10):
the same writes collect signed changes in ``temp.case_delta``, :func:`_apply_case_deltas` folds them in. A prune
deletes none, and keeps of the days before the horizon each key's latest; a later change there lands on the eve.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

from ...durations import DAY_S as _DAY_S
from .connection import StoreBase, read_only_uri
from .rows import MergeStats, PruneStats
from .schema import COUNTED_SCAN

__all__ = ["StoreMaintenance", "DayTallies", "day_of"]

_OPEN = "('running', 'interrupted')"
_WATERMARKED = ("scans", "incidents", "quarantine_history", "policy_decisions", "action_attempts")
"""The input tables a merge takes past a watermark (row id), in the column order of ``merge_sources``."""
_REOPEN_S = _DAY_S
"""An input's ``interrupted`` scan is read again by merges for this long after it was marked: a scanner the
policy's sweep took for dead may still finish it. Older ones are final (and ``prune`` rolls them up)."""

_ADD_TALLIES = (
    "INSERT INTO main.day_tallies(device, family, day, executions, failures, test_s) {select} "
    "ON CONFLICT(device, family, day) DO UPDATE SET executions = executions + excluded.executions, "
    "failures = failures + excluded.failures, test_s = test_s + excluded.test_s"
)
"""Adds to ``day_tallies`` what ``{select}`` yields (VALUES or a SELECT of device, family, day and the three counts)."""


def day_of(t: float) -> int:
    """The UTC day (days since the epoch) of a Unix time, as the SQL ``CAST(t / 86400.0 AS INTEGER)`` computes it."""
    return int(t / _DAY_S)


class DayTallies:
    """Changes to ``day_tallies`` and to the case tallies collected in Python (one scan's batch), written together."""

    def __init__(self) -> None:
        self._delta: dict[tuple[str, str, int], list[float]] = {}
        self._cases: dict[tuple[str, str, int], list[Any]] = {}

    def add(self, device: str, family: str, started_at: float, executions: int, failures: int, seconds: float,
            *, case: str | None = None) -> None:
        """Rows that change by these amounts; with ``case``, passing first executions of it (case tallies too)."""
        key = (device, family, day_of(started_at))
        d = self._delta.setdefault(key, [0, 0, 0.0])
        d[0] += executions
        d[1] += failures
        d[2] += seconds
        if case is not None:
            c = self._cases.setdefault((device, case, key[2]), [family, 0, 0.0])
            c[1] += executions
            c[2] += seconds

    def write(self, conn: Any) -> None:
        if self._delta:
            conn.executemany(_ADD_TALLIES.format(select="VALUES (?, ?, ?, ?, ?, ?)"),
                             [(*key, int(n), int(k), s) for key, (n, k, s) in self._delta.items()])
            self._delta.clear()
        if self._cases:
            _case_tables(conn)
            conn.executemany("INSERT INTO temp.case_delta(device, case_id, day, family, executions, seconds) VALUES "
                             "(?, ?, ?, ?, ?, ?)", [(*k, f, int(n), s) for k, (f, n, s) in self._cases.items()])
            self._cases.clear()
            _apply_case_deltas(conn)


def _tally_rows(conn: Any, scans: str, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) the tallies of every row of the main store's scans ``scans`` (a subquery
    of scan ids): one pass over those rows for the day tallies, one for the case tallies' ``temp.case_delta``."""
    conn.execute(_ADD_TALLIES.format(select=(
        f"SELECT r.device, r.family, CAST(r.started_at / {_DAY_S} AS INTEGER) AS d, "
        f"{sign} * TOTAL((r.attempt = 0) * r.executions), {sign} * TOTAL(r.attempt = 0 AND r.passed = 0), "
        f"{sign} * TOTAL(r.duration_s) FROM main.results r WHERE r.scan IN ({scans}) GROUP BY r.device, r.family, d "
        "HAVING true")))
    _case_tables(conn)
    conn.execute(
        "INSERT INTO temp.case_delta(device, case_id, day, family, executions, seconds) "
        f"SELECT r.device, r.case_id, CAST(r.started_at / {_DAY_S} AS INTEGER) AS d, MIN(r.family), "
        f"{sign} * SUM(r.executions), {sign} * TOTAL(r.duration_s) FROM main.results r WHERE r.scan IN ({scans}) "
        "AND r.passed = 1 AND r.attempt = 0 GROUP BY r.device, r.case_id, d")


def _case_tables(conn: Any) -> None:  # the temporary tables of the case tallies' changes (this connection's)
    sums = "family TEXT, executions INTEGER, seconds REAL"
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS case_delta(device TEXT, case_id TEXT, day INTEGER, {sums})")
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS case_run(device TEXT, case_id TEXT, day INTEGER, {sums}, "
                 "PRIMARY KEY (device, case_id, day)) WITHOUT ROWID")
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS case_keys(device TEXT, case_id TEXT, first INTEGER, last INTEGER, "
                 f"{sums}, append INTEGER, PRIMARY KEY (device, case_id)) WITHOUT ROWID")


def _apply_case_deltas(conn: Any) -> None:
    """Fold ``temp.case_delta`` (signed changes per device, case and UTC day, clamped to the horizon's eve) into
    ``case_tallies`` and ``case_totals``. ``case_run``: each key's running sum of its changes by day; ``case_keys``:
    its first and last day changed, whole change, and whether it all comes after the key's latest day (today's
    scans): then a row per day changed is the totals plus the running sum. Otherwise a row at each day changed
    takes the total before it, and every row from the first changed day on gains the running sum at its day. The
    totals gain the whole change, the same addition as the key's latest row: they stay equal to it bit for bit."""
    horizon = conn.execute("SELECT value FROM main.meta WHERE key = 'pruned_before'").fetchone()
    eve = -(2**62) if horizon is None else int(float(horizon[0]) // _DAY_S) - 1
    for table in ("case_run", "case_keys"):
        conn.execute(f"DELETE FROM temp.{table}")
    conn.execute(
        "INSERT INTO temp.case_run(device, case_id, day, family, executions, seconds) "
        "SELECT device, case_id, day, family, SUM(n) OVER w, SUM(s) OVER w FROM ("
        "  SELECT device, case_id, MAX(day, ?) AS day, MIN(family) AS family, SUM(executions) AS n, "
        "    TOTAL(seconds) AS s FROM temp.case_delta GROUP BY device, case_id, MAX(day, ?) HAVING n != 0 OR s != 0) "
        "WINDOW w AS (PARTITION BY device, case_id ORDER BY day)", (eve, eve))
    conn.execute("DELETE FROM temp.case_delta")
    conn.execute(  # the last day's row per key (MAX's bare columns: family, the whole change), and its first day
        "INSERT INTO temp.case_keys(device, case_id, family, first, last, executions, seconds, append) "
        "SELECT device, case_id, family, first, last, executions, seconds, COALESCE((SELECT t.day "
        "  FROM main.case_totals t WHERE t.device = k.device AND t.case_id = k.case_id) < first, 1) FROM ("
        "  SELECT device, case_id, family, (SELECT MIN(x.day) FROM temp.case_run x WHERE x.device = r.device "
        "    AND x.case_id = r.case_id) AS first, MAX(day) AS last, executions, seconds "
        "  FROM temp.case_run r GROUP BY device, case_id) k")
    keyed = "FROM temp.case_keys k JOIN temp.case_run r USING (device, case_id)"
    conn.execute(
        "INSERT INTO main.case_tallies(device, day, case_id, executions, seconds) SELECT r.device, r.day, r.case_id, "
        f"COALESCE(t.executions, 0) + r.executions, COALESCE(t.seconds, 0.0) + r.seconds {keyed} "
        "LEFT JOIN main.case_totals t USING (device, case_id) WHERE k.append")
    floor = ("COALESCE((SELECT x.{0} FROM main.case_tallies x WHERE x.device = r.device AND x.case_id = r.case_id "
             "AND x.day < r.day ORDER BY x.day DESC LIMIT 1), 0)")
    conn.execute("INSERT OR IGNORE INTO main.case_tallies(device, day, case_id, executions, seconds) SELECT "
                 f"r.device, r.day, r.case_id, {floor.format('executions')}, {floor.format('seconds')} {keyed} "
                 "WHERE NOT k.append")
    run = ("(SELECT r.{0} FROM temp.case_run r WHERE r.device = case_tallies.device AND r.case_id = "
           "case_tallies.case_id AND r.day <= case_tallies.day ORDER BY r.day DESC LIMIT 1)")
    conn.execute(
        f"UPDATE main.case_tallies SET executions = executions + {run.format('executions')}, seconds = seconds + "
        f"{run.format('seconds')} WHERE (device, day, case_id) IN (SELECT x.device, x.day, x.case_id FROM "
        "  temp.case_keys k CROSS JOIN main.case_tallies x ON x.device = k.device AND x.day >= k.first "
        "  AND x.case_id = k.case_id WHERE NOT k.append)")
    conn.execute(
        "INSERT INTO main.case_totals(device, case_id, family, first, day, executions, seconds) SELECT device, "
        "case_id, family, first, last, executions, seconds FROM temp.case_keys WHERE true ON CONFLICT(device, case_id) "
        "DO UPDATE SET executions = executions + excluded.executions, seconds = seconds + excluded.seconds, "
        "first = MIN(first, excluded.first), day = MAX(day, excluded.day)")


def _thin_case_tallies(conn: Any, horizon: float) -> None:
    """Of the case tallies up to the horizon's eve keep each key's latest, moved to the eve (nothing changed in
    between), reading only those days, device by device."""
    eve, devices = int(horizon // _DAY_S) - 1, "device IN (SELECT DISTINCT device FROM main.case_totals)"
    conn.execute("INSERT OR REPLACE INTO main.case_tallies(device, day, case_id, executions, seconds) SELECT device, "
                 "?, case_id, executions, seconds FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY device, case_id "
                 f"ORDER BY day DESC) AS k FROM main.case_tallies WHERE {devices} AND day <= ?) "
                 "WHERE k = 1 AND day < ?", (eve, eve, eve))
    conn.execute(f"DELETE FROM main.case_tallies WHERE {devices} AND day < ?", (eve,))
    conn.execute("UPDATE main.case_totals SET first = ?, day = MAX(day, ?) WHERE first < ?", (eve, eve, eve))


class StoreMaintenance(StoreBase):
    """Merge and prune (part of :class:`sdcguard.fleet.store.store.Store`)."""

    def merge_from(self, path: Path, *, full: bool = False) -> MergeStats:
        """Merge the store at ``path`` (checked by :func:`~.connection.check_merge_input`) into this one."""
        conn = self._conn
        conn.execute("ATTACH DATABASE ? AS src", (read_only_uri(Path(path)),))
        try:
            with self._write():
                return self._merge_attached(str(path), full=full)
        finally:
            conn.execute("DETACH DATABASE src")

    def _merge_attached(self, path: str, *, full: bool) -> MergeStats:
        conn = self._conn
        source = conn.execute("SELECT value FROM src.meta WHERE key = 'store_id'").fetchone()[0]
        mark = None if full else conn.execute(
            "SELECT scans, incidents, history, decisions, attempts, open_scans, marks FROM main.merge_sources "
            "WHERE source = ?", (source,)).fetchone()
        after = dict(zip(_WATERMARKED, mark[:5] if mark else (0,) * len(_WATERMARKED)))
        rewound = _check_marks(conn, after, json.loads(mark[6]) if mark else {})
        reopened = json.loads(mark[5]) if mark else []
        horizon = self.pruned_before or float("-inf")
        devices = _merge_devices(conn)
        new_scans, results, skipped = _merge_scans(conn, after["scans"], reopened, horizon)
        incidents, history = _merge_appended(conn, after["incidents"], after["quarantine_history"],
                                             after["policy_decisions"], after["action_attempts"])
        _remember(conn, source, path)
        return MergeStats(source=path, devices=devices, scans=new_scans, results=results, incidents=incidents,
                          quarantine_history=history, skipped_scans=skipped, rewound=tuple(rewound))

    def prune(self, *, before: float) -> PruneStats:
        """Roll every finished scan that started before ``before`` (rounded down to a UTC midnight) into the
        daily roll-ups and delete its rows; returns what was done. Scans still ``running`` are left alone;
        ``interrupted`` ones are final by then and go like the others (their executions count, as everywhere).
        The case tallies still count the rows deleted (:func:`_thin_case_tallies`)."""
        horizon = math.floor(before / _DAY_S) * _DAY_S
        days = [int(r[0]) for r in self._rows(
            f"SELECT DISTINCT CAST(started_at / {_DAY_S} AS INTEGER) FROM scans WHERE started_at < ? "
            "AND status != 'running' ORDER BY 1", (horizon,))]
        scans = results = rollup_rows = 0
        for day in days:
            lo, hi = day * _DAY_S, min((day + 1) * _DAY_S, horizon)
            with self._write() as conn:
                s, r, n = _prune_day(conn, lo, hi)
                scans, results, rollup_rows = scans + s, results + r, rollup_rows + n
                last = conn.execute("SELECT MAX(day) FROM rollups").fetchone()[0]
                if last is not None:
                    _set_meta(conn, "rollup_last_day", int(last))
                _set_meta(conn, "pruned_before", max(hi, float(self._meta("pruned_before") or hi)))
        with self._write() as conn:
            if not days:
                _set_meta(conn, "pruned_before", max(horizon, float(self._meta("pruned_before") or horizon)))
            _thin_case_tallies(conn, float(self._meta("pruned_before") or horizon))
        return PruneStats(before=horizon, scans=scans, results=results, rollup_rows=rollup_rows)

    def vacuum(self) -> None:
        """Rewrite the file without its free pages (after a prune or a migration that folded many rows)."""
        self._retry(lambda: self._conn.execute("VACUUM"))


def _prune_day(conn: Any, lo: float, hi: float) -> tuple[int, int, int]:
    """Roll the finished scans that started in ``[lo, hi)`` into the roll-ups and delete them, inside the caller's
    transaction; ``(scans, rows, roll-up rows written)``.

    One pass over the scans' rows (``prune_agg``: per day, device and family); everything else derives from it:
    the per-device roll-ups and their all-time totals, the day tallies (less what is deleted; a day left without
    rows loses its tallies outright, so no rounding residue of the testing seconds stays behind), and the fleet's
    day rows (``rollup_days``), summed from the per-device roll-ups of the days touched."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_scans(id INTEGER PRIMARY KEY)")
    conn.execute("DELETE FROM temp.prune_scans")
    conn.execute("INSERT INTO temp.prune_scans SELECT id FROM scans WHERE started_at >= ? AND started_at < ? "
                 "AND status != 'running'", (lo, hi))
    conn.execute("DROP TABLE IF EXISTS temp.prune_agg")
    conn.execute(
        f"""CREATE TEMP TABLE prune_agg AS SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS day, device, family,
              TOTAL((attempt = 0) * executions) AS executions, TOTAL(attempt = 0 AND passed = 0) AS failures,
              TOTAL(duration_s) AS test_s
            FROM results WHERE scan IN (SELECT id FROM temp.prune_scans) GROUP BY day, device, family""")
    rollup_rows = conn.execute(
        """INSERT INTO rollups(day, device, family, executions, failures, test_s)
           SELECT day, device, family, executions, failures, test_s FROM temp.prune_agg WHERE true
           ON CONFLICT(day, device, family) DO UPDATE SET executions = executions + excluded.executions,
             failures = failures + excluded.failures, test_s = test_s + excluded.test_s""").rowcount
    conn.execute(
        """INSERT INTO rollup_totals(device, family, executions, failures, test_s)
           SELECT device, family, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM temp.prune_agg
           GROUP BY device, family
           ON CONFLICT(device, family) DO UPDATE SET executions = executions + excluded.executions,
             failures = failures + excluded.failures, test_s = test_s + excluded.test_s""")
    conn.execute(
        """INSERT OR REPLACE INTO rollup_days(day, executions, failures, test_s)
           SELECT day, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM rollups
           WHERE day IN (SELECT DISTINCT day FROM temp.prune_agg) GROUP BY day""")
    conn.execute(_ADD_TALLIES.format(select=(
        "SELECT device, family, day, -executions, -failures, -test_s FROM temp.prune_agg WHERE true")))
    conn.execute(
        f"""INSERT INTO scan_rollups(day, device, complete, last_complete)
            SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS d, device, TOTAL({COUNTED_SCAN}),
              MAX(CASE WHEN {COUNTED_SCAN} THEN COALESCE(finished_at, started_at) END)
            FROM scans WHERE id IN (SELECT id FROM temp.prune_scans) GROUP BY d, device
            ON CONFLICT(day, device) DO UPDATE SET complete = complete + excluded.complete,
              last_complete = MAX(COALESCE(last_complete, excluded.last_complete),
                                  COALESCE(excluded.last_complete, last_complete))""")
    conn.execute(
        f"""INSERT INTO scan_rollup_totals(device, complete, last_complete)
           SELECT device, TOTAL({COUNTED_SCAN}),
             MAX(CASE WHEN {COUNTED_SCAN} THEN COALESCE(finished_at, started_at) END)
           FROM scans WHERE id IN (SELECT id FROM temp.prune_scans) GROUP BY device
           ON CONFLICT(device) DO UPDATE SET complete = complete + excluded.complete,
             last_complete = MAX(COALESCE(last_complete, excluded.last_complete),
                                 COALESCE(excluded.last_complete, last_complete))""")
    results = conn.execute("DELETE FROM results WHERE scan IN (SELECT id FROM temp.prune_scans)").rowcount
    scans = conn.execute("DELETE FROM scans WHERE id IN (SELECT id FROM temp.prune_scans)").rowcount
    conn.execute("""DELETE FROM day_tallies WHERE executions = 0 AND failures = 0 AND abs(test_s) < 1e-6
                    AND (device, family, day) IN (SELECT device, family, day FROM temp.prune_agg)""")
    for (day,) in conn.execute("SELECT DISTINCT day FROM temp.prune_agg").fetchall():
        if conn.execute("SELECT 1 FROM results INDEXED BY results_time WHERE started_at >= ? AND started_at < ? "
                        "LIMIT 1", (day * _DAY_S, (day + 1) * _DAY_S)).fetchone() is None:
            conn.execute("DELETE FROM day_tallies WHERE day = ?", (day,))
    return scans, results, rollup_rows


def _merge_devices(conn: Any) -> int:
    """Devices: the union, widest first/last seen, known facts kept; returns how many are new."""
    before_devices = conn.execute("SELECT COUNT(*) FROM main.devices").fetchone()[0]
    conn.execute(
        """INSERT INTO main.devices(id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen)
           SELECT id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen FROM src.devices WHERE true
           ON CONFLICT(id) DO UPDATE SET
             host = CASE WHEN excluded.last_seen > devices.last_seen THEN excluded.host ELSE devices.host END,
             model = COALESCE(devices.model, excluded.model), serial = COALESCE(devices.serial, excluded.serial),
             pci_bus_id = COALESCE(devices.pci_bus_id, excluded.pci_bus_id),
             idx = COALESCE(devices.idx, excluded.idx), first_seen = MIN(devices.first_seen, excluded.first_seen),
             last_seen = MAX(devices.last_seen, excluded.last_seen)""")
    return int(conn.execute("SELECT COUNT(*) FROM main.devices").fetchone()[0]) - int(before_devices)


def _merge_scans(conn: Any, scans_after: int, reopened: list[int], horizon: float) -> tuple[int, int, int]:
    """New scans and those still open at the last merge, with their rows; ``(new scans, new rows, skipped)``."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS merge_scans(src_id INTEGER PRIMARY KEY, uuid TEXT, dst_id INTEGER)")
    conn.execute("DELETE FROM temp.merge_scans")
    conn.execute(
        "INSERT INTO temp.merge_scans(src_id, uuid) SELECT id, uuid FROM src.scans "
        "WHERE (id > ? OR id IN (SELECT value FROM json_each(?)))",
        (scans_after, json.dumps(reopened)),
    )
    # Scans older than our retention horizon are in our roll-ups already, except those we still hold open
    # (prune leaves a running scan alone): those take their final state from the input as usual.
    old = ("src_id IN (SELECT id FROM src.scans WHERE started_at < ?) "
           f"AND uuid NOT IN (SELECT uuid FROM main.scans WHERE status IN {_OPEN})")
    skipped = conn.execute(f"SELECT COUNT(*) FROM temp.merge_scans WHERE {old}", (horizon,)).fetchone()[0]
    conn.execute(f"DELETE FROM temp.merge_scans WHERE {old}", (horizon,))
    new_scans = conn.execute(
        "SELECT COUNT(*) FROM temp.merge_scans m WHERE NOT EXISTS (SELECT 1 FROM main.scans s WHERE s.uuid = m.uuid)"
    ).fetchone()[0]
    conn.execute(
        """INSERT INTO main.scans(uuid, device, host, started_at, finished_at, budget_s, status, meta, total)
           SELECT s.uuid, s.device, s.host, s.started_at, s.finished_at, s.budget_s, s.status, s.meta, s.total
           FROM src.scans s JOIN temp.merge_scans m ON m.src_id = s.id WHERE true
           ON CONFLICT(uuid) DO UPDATE SET status = excluded.status, finished_at = excluded.finished_at,
             total = excluded.total, meta = excluded.meta
           WHERE scans.status IN ('running', 'interrupted') AND excluded.status NOT IN ('running', 'interrupted')""")
    conn.execute("UPDATE temp.merge_scans SET dst_id = (SELECT id FROM main.scans s WHERE s.uuid = merge_scans.uuid)")
    before_results = conn.execute(
        "SELECT COUNT(*) FROM main.results WHERE scan IN (SELECT dst_id FROM temp.merge_scans)").fetchone()[0]
    # The day tallies follow the rows: minus those this merge replaces, plus what it writes.
    _tally_rows(conn, "SELECT dst_id FROM temp.merge_scans", -1)
    # Results by (scan, seq); the input's own rows of its scans win (a passing row's count only grows).
    conn.execute(
        """INSERT INTO main.results(scan, seq, device, case_id, family, seed, passed, duration_s, started_at,
             output_digest, mismatches, element, expected, actual, xor_mask, location, attempt, sticky, detail,
             executions, last_started_at)
           SELECT m.dst_id, r.seq, r.device, r.case_id, r.family, r.seed, r.passed, r.duration_s, r.started_at,
             r.output_digest, r.mismatches, r.element, r.expected, r.actual, r.xor_mask, r.location, r.attempt,
             r.sticky, r.detail, r.executions, r.last_started_at
           FROM temp.merge_scans m JOIN src.results r ON r.scan = m.src_id WHERE true
           ON CONFLICT(scan, seq) DO UPDATE SET executions = excluded.executions,
             duration_s = excluded.duration_s, started_at = excluded.started_at,
             last_started_at = excluded.last_started_at, sticky = excluded.sticky, detail = excluded.detail""")
    _tally_rows(conn, "SELECT dst_id FROM temp.merge_scans", 1)
    _apply_case_deltas(conn)
    results = conn.execute(
        "SELECT COUNT(*) FROM main.results WHERE scan IN (SELECT dst_id FROM temp.merge_scans)"
    ).fetchone()[0] - before_results
    # Scan counters follow the merged rows (first attempts, like the rates).
    conn.execute(
        """UPDATE main.scans SET
             executions = (SELECT TOTAL(r.executions) FROM main.results r WHERE r.scan = scans.id AND r.attempt = 0),
             failures = (SELECT COUNT(*) FROM main.results r WHERE r.scan = scans.id AND r.attempt = 0
                         AND r.passed = 0)
           WHERE id IN (SELECT dst_id FROM temp.merge_scans)""")
    return new_scans, results, skipped


def _merge_appended(conn: Any, inc_after: int, hist_after: int, dec_after: int, att_after: int) -> tuple[int, int]:
    """Pass digests, incidents, quarantine history, decisions, actions and their attempts past the watermark;
    ``(new incidents, new history rows)``."""
    conn.execute(
        """INSERT INTO main.pass_digests(case_id, digest, first_seen)
           SELECT case_id, digest, first_seen FROM src.pass_digests WHERE true
           ON CONFLICT(case_id, digest) DO UPDATE SET first_seen = MIN(pass_digests.first_seen, excluded.first_seen)""")
    incidents = conn.execute(
        """INSERT OR IGNORE INTO main.incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail,
             parameter, sticky, job, time, record)
           SELECT uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, sticky, job, time,
             record FROM src.incidents WHERE id > ?""", (inc_after,)).rowcount
    conn.execute(
        """INSERT OR IGNORE INTO main.incident_devices(incident, device)
           SELECT m.id, d.device FROM src.incident_devices d JOIN src.incidents i ON i.id = d.incident
           JOIN main.incidents m ON m.uuid = i.uuid WHERE i.id > ?""", (inc_after,))
    history = conn.execute(
        """INSERT OR IGNORE INTO main.quarantine_history(uuid, device, action, time, by, reason)
           SELECT uuid, device, action, time, by, reason FROM src.quarantine_history WHERE id > ?""",
        (hist_after,)).rowcount
    conn.execute(
        """INSERT OR IGNORE INTO main.policy_decisions(uuid, time, device, decision, reason)
           SELECT uuid, time, device, decision, reason FROM src.policy_decisions WHERE id > ?""", (dec_after,))
    conn.execute(
        """INSERT INTO main.actions(uuid, device, action, quarantined_since, created, done, attempts)
           SELECT uuid, device, action, quarantined_since, created, done, attempts FROM src.actions WHERE true
           ON CONFLICT(device, action, quarantined_since) DO UPDATE SET done = MAX(actions.done, excluded.done)
           ON CONFLICT(uuid) DO UPDATE SET done = MAX(actions.done, excluded.done)""")
    conn.execute(
        """INSERT OR IGNORE INTO main.action_attempts(uuid, action_id, time, argv, returncode, ok, output)
           SELECT t.uuid, m.id, t.time, t.argv, t.returncode, t.ok, t.output
           FROM src.action_attempts t JOIN src.actions a ON a.id = t.action_id
           JOIN main.actions m ON m.device = a.device AND m.action = a.action
             AND m.quarantined_since = a.quarantined_since WHERE t.id > ?""", (att_after,))
    conn.execute(
        """UPDATE main.actions SET attempts = (SELECT COUNT(*) FROM main.action_attempts t
                                               WHERE t.action_id = actions.id)
           WHERE id IN (SELECT m.id FROM main.actions m JOIN src.actions a ON m.device = a.device
                        AND m.action = a.action AND m.quarantined_since = a.quarantined_since)""")
    conn.execute(
        """INSERT OR IGNORE INTO main.checkpoints(uuid, checkpoint_id, step, verified, digest, job, time, status,
                                                  detail)
           SELECT uuid, checkpoint_id, step, verified, digest, job, time, status, detail FROM src.checkpoints
           WHERE true""")
    conn.execute(
        """INSERT OR IGNORE INTO main.checkpoint_scrubs(uuid, checkpoint_id, status, tensors, bytes, bad, detail,
                                                        host, time)
           SELECT uuid, checkpoint_id, status, tensors, bytes, bad, detail, host, time FROM src.checkpoint_scrubs
           WHERE true""")
    _replay_quarantine(conn, hist_after)
    return incidents, history


def _check_marks(conn: Any, after: dict[str, int], remembered: dict[str, str]) -> list[str]:
    """Reset (to 0: read in full) every watermark whose row in the input is gone or is another row than the one
    remembered; returns those tables. A watermark without a remembered uuid (from before schema 7) is not trusted
    either."""
    rewound = []
    for table, top in after.items():
        if not top:
            continue
        row = conn.execute(f"SELECT uuid FROM src.{table} WHERE id = ?", (top,)).fetchone()
        if row is None or row[0] != remembered.get(table):
            rewound.append(table)
            after[table] = 0
    return rewound


def _remember(conn: Any, source: str, path: str) -> None:
    """The watermark of this input: the highest row of every append-only table and its uuid, and the scans still
    open (running, or interrupted lately)."""
    tops: list[int] = []
    marks: dict[str, str] = {}
    for table in _WATERMARKED:
        row = conn.execute(f"SELECT id, uuid FROM src.{table} ORDER BY id DESC LIMIT 1").fetchone()
        tops.append(0 if row is None else int(row[0]))
        if row is not None:
            marks[table] = row[1]
    still_open = [r[0] for r in conn.execute(
        "SELECT id FROM src.scans WHERE status = 'running' OR (status = 'interrupted' AND "
        "COALESCE(finished_at, started_at) >= ?)", (time.time() - _REOPEN_S,))]
    conn.execute(
        "INSERT INTO main.merge_sources(source, path, merged_at, scans, incidents, history, decisions, attempts, "
        "open_scans, marks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(source) DO UPDATE SET "
        "path = excluded.path, merged_at = excluded.merged_at, scans = excluded.scans, "
        "incidents = excluded.incidents, history = excluded.history, decisions = excluded.decisions, "
        "attempts = excluded.attempts, open_scans = excluded.open_scans, marks = excluded.marks",
        (source, path, time.time(), *tops, json.dumps(still_open), json.dumps(marks, sort_keys=True)),
    )


def _set_meta(conn: sqlite3.Connection, key: str, value: object) -> None:
    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (key, str(value)))


def _replay_quarantine(conn: sqlite3.Connection, history_after: int) -> None:
    """Current state of every device the input's new history names = its latest change in the merged history."""
    rows = conn.execute(
        """SELECT h.device, h.action, h.time, h.by, h.reason FROM main.quarantine_history h
           WHERE h.device IN (SELECT device FROM src.quarantine_history WHERE id > ?)
             AND h.id = (SELECT id FROM main.quarantine_history x WHERE x.device = h.device
                         ORDER BY x.time DESC, x.id DESC LIMIT 1)""", (history_after,)
    ).fetchall()
    for device, action, t, by, reason in rows:
        if action == "probation_passed":
            conn.execute("DELETE FROM main.quarantine WHERE device = ?", (device,))
            continue
        state = "quarantined" if action == "quarantine" else "probation"
        conn.execute(
            "INSERT INTO main.quarantine(device, state, since, reason, by) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(device) DO UPDATE SET state = excluded.state, since = excluded.since, "
            "reason = excluded.reason, by = excluded.by",
            (device, state, t, reason, by),
        )
