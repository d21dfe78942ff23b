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
failure and the time resolution below a day. A later merge skips input scans older than the horizon that an
earlier merge took: they are already in the roll-ups; those past the watermark (an input away longer than the
retention, a spool forwarded after a long outage) are merged and rolled up in the same transaction. Past the
watermark *as remembered*, even when the merge rewinds it: an id above it did not exist at the last merge (ids
only grow past the rows an input holds), so no merge saw that scan, whatever became of the row at the watermark
(a node that pruned it and then recorded scans the fleet's horizon passed lost them). A scan that reused an id up
to the watermark and started before the horizon cannot be told from one rolled up, and is skipped.

**Day tallies.** ``day_tallies`` equals, at every commit, what the rows of ``results`` add up to per UTC day (of a
row's start), device and family: :class:`DayTallies` for a scan's batch (the store's write path), minus and plus
one pass over the rows a merge replaces and writes, minus what a prune deletes.

**Case tallies** (the slowness statistic's running totals per device, case and day, schema version 10:
:mod:`.schema.tally_tables`): the same writes collect signed changes in ``temp.case_delta``,
:func:`~.writes.tallies.apply_deltas` folds them in. A prune deletes none, and keeps of the days before the horizon each
key's latest; a later change there lands on the eve.

**Family tallies** (the rates' running totals per device, family and day, version 12): kept like the case tallies,
from the same changes as the day tallies; a prune takes from them what it rolls up from the end of each pruned day
on (a scan that started before the horizon it records and ran past its midnight), which the roll-ups then count,
so a window from the horizon on is the family tallies' difference plus the roll-ups, each execution once.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from ...durations import DAY_S as _DAY_S
from ...errors import BadInput
from .core import StoreCore
from .rows import MergeStats, PruneStats, SpoolBacklog
from .schema.tables import COUNTED_SCAN
from .sqlite.files import read_only_uri
from .writes.merging import (
    check_marks,
    identities_changing,
    merge_appended,
    merge_devices,
    merge_scans,
    read_mark,
    remember,
    set_meta,
)
from .writes.tallies import ADD_TALLIES, FAMILIES, apply_deltas, running_tables, thin_case_tallies

__all__ = ["Maintenance"]


class Maintenance:
    """Merge, prune, vacuum, roles, a spool's mark, and the store's identity and horizon.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def merge(self, path: Path, *, full: bool = False) -> MergeStats:
        """Merge the store at ``path`` (a SQLite file, checked by :func:`~.sqlite.files.check_merge_input`) into this
        one: read through ``ATTACH`` into a SQLite store, copied into temporary tables of the same transaction
        (:mod:`.postgres.transfer`: only what the watermarks let through) into a PostgreSQL store."""
        if self._core.kind == "postgresql":
            from .postgres.transfer import copy_merge_input

            with self._core.write() as conn:
                copy_merge_input(conn, Path(path), full=full, lock=self._core.backend.lock)
                stats = self._merge_attached(str(path), full=full)
            self._core.backend.refresh_statistics()
            return stats
        conn = self._core.backend.conn
        conn.execute("ATTACH DATABASE ? AS src", (read_only_uri(Path(path)),))
        try:
            with self._core.write():
                return self._merge_attached(str(path), full=full)
        finally:
            conn.execute("DETACH DATABASE src")

    def _merge_attached(self, path: str, *, full: bool) -> MergeStats:
        conn = self._core.backend.conn
        source = conn.execute("SELECT value FROM src.meta WHERE key = 'store_id'").fetchone()[0]
        self._core.backend.lock("source", [source])  # one merge of an input at a time (a spool forwarded twice at once)
        after, remembered, reopened = read_mark(conn, source, full=full)
        taken = None if full else after["scans"]  # as remembered: a rewound watermark still bounds what was seen
        rewound = check_marks(conn, after, remembered)
        horizon = self._core.pruned_before or float("-inf")
        # the input's devices before their rows: a scan writing one of them directly waits here, not in a circle;
        # their versions move only where the merge changes them (a new identity here, merged scans below)
        self._core.lock_devices((r[0] for r in conn.execute("SELECT id FROM src.devices").fetchall()), changed=False)
        self._core.lock_devices(identities_changing(conn))
        devices = merge_devices(conn)
        new_scans, results, skipped, late = merge_scans(
            conn,
            after["scans"],
            reopened,
            horizon,
            self._core.lock_devices,
            taken=taken,
            analyze=self._core.backend.analyze,
        )
        for day in late:  # what the merge brought from before the horizon goes to the roll-ups at once
            _prune_day(conn, day * _DAY_S, min((day + 1) * _DAY_S, horizon))
        if late:
            set_meta(conn, "rollup_last_day", int(conn.execute("SELECT MAX(day) FROM rollups").fetchone()[0]))
            thin_case_tallies(conn, horizon)
        self._core.backend.lock("quarantine")  # the merged history replays the quarantine state
        incidents, history = merge_appended(
            conn, after["incidents"], after["quarantine_history"], after["policy_decisions"], after["action_attempts"]
        )
        remember(conn, source, path)
        return MergeStats(
            source=path,
            devices=devices,
            scans=new_scans,
            results=results,
            incidents=incidents,
            quarantine_history=history,
            skipped_scans=skipped,
            rewound=tuple(rewound),
        )

    def prune(self, *, before: float) -> PruneStats:
        """Roll every finished scan that started before ``before`` (rounded down to a UTC midnight) into the
        daily roll-ups and delete its rows; returns what was done. Scans still ``running`` are left alone;
        ``interrupted`` ones are final by then and go like the others (their executions count, as everywhere).
        The case tallies still count the rows deleted (:func:`thin_case_tallies`)."""
        spool_for = self._core.meta("spool_for")
        if spool_for is not None:
            raise BadInput(
                f"{self._core.path} is the spool of {spool_for}: it holds what an outage kept from the server and is "
                "never pruned; send it with `sdcguard forward` (the server is where old scans are pruned)"
            )
        horizon = math.floor(before / _DAY_S) * _DAY_S
        days = [
            int(r[0])
            for r in self._core.rows(
                f"SELECT DISTINCT CAST(started_at / {_DAY_S} AS INTEGER) FROM scans WHERE started_at < ? "
                "AND status != 'running' ORDER BY 1",
                (horizon,),
            )
        ]
        scans = results = rollup_rows = 0
        for day in days:
            lo, hi = day * _DAY_S, min((day + 1) * _DAY_S, horizon)
            with self._core.write() as conn:
                self._core.backend.lock("tallies")  # every other writer waits (they take it shared)
                if self._core.kind == "sqlite":  # SQLite would give a deleted top id to the next scan: never again
                    top = max(int(self._core.one("SELECT COALESCE(MAX(id), 0) FROM scans")), _scan_id_floor(self._core))
                    set_meta(conn, "scan_id_floor", top)
                s, r, n = _prune_day(conn, lo, hi)
                scans, results, rollup_rows = scans + s, results + r, rollup_rows + n
                last = conn.execute("SELECT MAX(day) FROM rollups").fetchone()[0]
                if last is not None:
                    set_meta(conn, "rollup_last_day", int(last))
                set_meta(conn, "pruned_before", max(hi, float(self._core.meta("pruned_before") or hi)))
        with self._core.write() as conn:
            self._core.backend.lock("tallies")
            if not days:
                set_meta(conn, "pruned_before", max(horizon, float(self._core.meta("pruned_before") or horizon)))
            thin_case_tallies(conn, float(self._core.meta("pruned_before") or horizon))
        return PruneStats(before=horizon, scans=scans, results=results, rollup_rows=rollup_rows)

    def vacuum(self) -> None:
        """Rewrite the file without its free pages (after a prune or a migration that folded many rows)."""
        self._core.backend.vacuum()

    def mark_spool(self, server: str) -> None:
        """Mark this (SQLite) store as the spool of the server store ``server`` (its URL, which holds no
        password): :meth:`prune` then refuses it (:mod:`.spool`)."""
        if self.spool_for != server:
            with self._core.write() as conn:
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('spool_for', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (server,),
                )

    def mark_drills(self) -> None:
        """Mark this (SQLite) store as a drill store: fire drills only (:mod:`sdcguard.fleet.store.drills`)."""
        with self._core.write() as conn:
            conn.execute(
                "INSERT INTO meta(key, value) VALUES ('drills', '1') ON CONFLICT(key) DO UPDATE SET value = '1'"
            )

    def high_water(self) -> tuple[int, int]:
        """The newest scan and incident ids: what a forward that starts now sends at least."""
        return (
            int(self._core.one("SELECT COALESCE(MAX(id), 0) FROM scans")),
            int(self._core.one("SELECT COALESCE(MAX(id), 0) FROM incidents")),
        )

    def mark_forwarded(self, began: float, sent: tuple[int, int]) -> None:
        """Record in this spool that a forward which began at ``began``, when its :meth:`high_water` was ``sent``,
        reached its server (:func:`~.spool.forward` calls it after the merge): its backlog (:meth:`backlog`) starts
        again from there, so what a writer added during the forward still counts as waiting."""
        with self._core.write() as conn:
            for key, value in (("forwarded_at", began), ("forwarded_scan", sent[0]), ("forwarded_incident", sent[1])):
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, str(value)),
                )

    @property
    def backlog(self) -> SpoolBacklog:
        """What this spool holds that has not reached its server since its last forward (:meth:`mark_forwarded`):
        scans begun or finished since, incidents recorded since, and when the oldest of them was written."""
        at = self._core.meta("forwarded_at")
        last = None if at is None else float(at)
        scan, incident = (int(self._core.meta(k) or 0) for k in ("forwarded_scan", "forwarded_incident"))
        scans, first_scan = self._core.rows(
            "SELECT COUNT(*), MIN(started_at) FROM scans WHERE id > ? OR COALESCE(finished_at, 0) > ?",
            (scan, last if last is not None else float("inf")),
        )[0]
        incidents, first_incident = self._core.rows(
            "SELECT COUNT(*), MIN(time) FROM incidents WHERE id > ?", (incident,)
        )[0]
        oldest = min((t for t in (first_scan, first_incident) if t is not None), default=None)
        return SpoolBacklog(scans=int(scans), incidents=int(incidents), oldest=oldest, last_forward=last)

    @property
    def holds_drills(self) -> bool:
        """Whether this is a drill store (:meth:`mark_drills`)."""
        return self._core.meta("drills") == "1"

    @property
    def spool_for(self) -> str | None:
        """The server store this store is the spool of (None: it is none)."""
        return self._core.meta("spool_for")

    def grant(self, role: str, kind: str = "writer", *, run: bool = True) -> list[str]:
        """Grant the server role ``role`` what a scan node or job (``writer``) or a reader needs on this store
        (:mod:`.postgres.roles`); ``run`` False only says how. Returns the SQL statements."""
        if self._core.kind != "postgresql":
            raise BadInput(f"{self._core.path} is a SQLite file: its access is the file's permissions, not roles")
        from .postgres.roles import grant

        with self._core.write() as conn:
            return grant(conn, role, kind, run=run)  # type: ignore[arg-type]  # checked there

    def row_count(self, table: Literal["results", "scans", "devices", "incidents", "rollups"]) -> int:
        """``SELECT COUNT(*)`` of one table: the floor every aggregation is measured against."""
        if table not in ("results", "scans", "devices", "incidents", "rollups"):
            raise ValueError(f"no table {table!r}")
        return int(self._core.one(f"SELECT COUNT(*) FROM {table}"))

    @property
    def store_id(self) -> str:
        """This store's identity (a uuid made when it was created): merges remember their inputs by it."""
        value = self._core.meta("store_id")
        assert value is not None, "every schema-4 store has a store_id"
        return value

    @property
    def pruned_before(self) -> float | None:
        """The retention horizon: scans that started before it live only in the daily roll-ups (None: never
        pruned)."""
        return self._core.pruned_before


def _scan_id_floor(core: StoreCore) -> int:
    """The highest scan id this SQLite store ever gave (a prune may have deleted it): a new scan's id is above it,
    so a merge's watermark never takes a new scan for one it already rolled up (:meth:`~.scans.Scans.begin`)."""
    return int(core.meta("scan_id_floor") or 0)


def _prune_day(conn: Any, lo: float, hi: float) -> tuple[int, int, int]:
    """Roll the finished scans that started in ``[lo, hi)`` into the roll-ups and delete them, inside the caller's
    transaction; ``(scans, rows, roll-up rows written)``.

    One pass over the scans' rows (``prune_agg``: per day, device and family); everything else derives from it:
    the per-device roll-ups and their all-time totals, the day tallies (less what is deleted; a day left without
    rows loses its tallies outright, so no rounding residue of the testing seconds stays behind), the family
    tallies (less what started from ``hi``'s day on), and the fleet's day rows (``rollup_days``), summed
    from the per-device roll-ups of the days touched."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_scans(id INTEGER PRIMARY KEY)")
    conn.execute("DELETE FROM temp.prune_scans")
    conn.execute(
        "INSERT INTO temp.prune_scans SELECT id FROM scans WHERE started_at >= ? AND started_at < ? "
        "AND status != 'running'",
        (lo, hi),
    )
    conn.execute("DROP TABLE IF EXISTS temp.prune_agg")
    conn.execute(
        f"""CREATE TEMP TABLE prune_agg AS SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS day, device, family,
              TOTAL(CASE WHEN attempt = 0 THEN executions ELSE 0 END) AS executions,
              TOTAL(CASE WHEN attempt = 0 AND passed = 0 THEN 1 ELSE 0 END) AS failures,
              TOTAL(duration_s) AS test_s
            FROM results WHERE scan IN (SELECT id FROM temp.prune_scans) GROUP BY day, device, family"""
    )
    rollup_rows = conn.execute(
        """INSERT INTO rollups(day, device, family, executions, failures, test_s)
           SELECT day, device, family, executions, failures, test_s FROM temp.prune_agg WHERE true
           ON CONFLICT(day, device, family) DO UPDATE SET executions = rollups.executions + excluded.executions,
             failures = rollups.failures + excluded.failures, test_s = rollups.test_s + excluded.test_s"""
    ).rowcount
    conn.execute(
        """INSERT INTO rollup_totals(device, family, executions, failures, test_s)
           SELECT device, family, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM temp.prune_agg
           GROUP BY device, family
           ON CONFLICT(device, family) DO UPDATE SET executions = rollup_totals.executions + excluded.executions,
             failures = rollup_totals.failures + excluded.failures, test_s = rollup_totals.test_s + excluded.test_s"""
    )
    conn.execute(
        """INSERT INTO rollup_days(day, executions, failures, test_s)
           SELECT day, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM rollups
           WHERE day IN (SELECT DISTINCT day FROM temp.prune_agg) GROUP BY day
           ON CONFLICT(day) DO UPDATE SET executions = excluded.executions, failures = excluded.failures,
             test_s = excluded.test_s"""
    )
    conn.execute(
        ADD_TALLIES.format(
            select=("SELECT device, family, day, -executions, -failures, -test_s FROM temp.prune_agg WHERE true")
        )
    )
    # The roll-ups now count what started from the day's end on (a scan's rows after its midnight): the family
    # tallies not. From ``hi``, the horizon this day's prune records, not the one asked for: with no scan to prune
    # in between, a window may start there, and the days from it on must not count a pruned row twice (found by
    # the family tallies' property test). Deltas of earlier days change a window's totals and its eve alike.
    running_tables(conn)
    conn.execute(
        "INSERT INTO temp.family_delta(device, family, day, executions, failures, test_s) "
        "SELECT device, family, day, -executions, -failures, -test_s FROM temp.prune_agg WHERE day >= ?",
        (int(hi // _DAY_S),),
    )
    apply_deltas(conn, FAMILIES)
    _roll_scans(conn)
    results = conn.execute("DELETE FROM results WHERE scan IN (SELECT id FROM temp.prune_scans)").rowcount
    scans = conn.execute("DELETE FROM scans WHERE id IN (SELECT id FROM temp.prune_scans)").rowcount
    conn.execute("""DELETE FROM day_tallies WHERE executions = 0 AND failures = 0 AND abs(test_s) < 1e-6
                    AND (device, family, day) IN (SELECT device, family, day FROM temp.prune_agg)""")
    for (day,) in conn.execute("SELECT DISTINCT day FROM temp.prune_agg").fetchall():
        if (
            conn.execute(
                "SELECT 1 FROM results INDEXED BY results_time WHERE started_at >= ? AND started_at < ? LIMIT 1",
                (day * _DAY_S, (day + 1) * _DAY_S),
            ).fetchone()
            is None
        ):
            conn.execute("DELETE FROM day_tallies WHERE day = ?", (day,))
    return scans, results, rollup_rows


def _roll_scans(conn: Any) -> None:
    """The complete scans among ``temp.prune_scans``, per day and device and in all, into the scan roll-ups."""
    conn.execute(
        f"""INSERT INTO scan_rollups(day, device, complete, last_complete)
            SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS d, device,
              TOTAL(CASE WHEN {COUNTED_SCAN} THEN 1 ELSE 0 END),
              MAX(CASE WHEN {COUNTED_SCAN} THEN COALESCE(finished_at, started_at) END)
            FROM scans WHERE id IN (SELECT id FROM temp.prune_scans) GROUP BY d, device
            ON CONFLICT(day, device) DO UPDATE SET complete = scan_rollups.complete + excluded.complete,
              last_complete = MAX(COALESCE(scan_rollups.last_complete, excluded.last_complete),
                                  COALESCE(excluded.last_complete, scan_rollups.last_complete))"""
    )
    conn.execute(
        f"""INSERT INTO scan_rollup_totals(device, complete, last_complete)
           SELECT device, TOTAL(CASE WHEN {COUNTED_SCAN} THEN 1 ELSE 0 END),
             MAX(CASE WHEN {COUNTED_SCAN} THEN COALESCE(finished_at, started_at) END)
           FROM scans WHERE id IN (SELECT id FROM temp.prune_scans) GROUP BY device
           ON CONFLICT(device) DO UPDATE SET complete = scan_rollup_totals.complete + excluded.complete,
             last_complete = MAX(COALESCE(scan_rollup_totals.last_complete, excluded.last_complete),
                                 COALESCE(excluded.last_complete, scan_rollup_totals.last_complete))"""
    )
