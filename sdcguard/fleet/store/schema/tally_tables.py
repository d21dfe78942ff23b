"""The running totals' tables, both backends' steps: the roll-ups summed over the fleet per day (version 6), the
day tallies (8), the case tallies (10) and the family tallies (12), which the store keeps exact in every write
(:mod:`..writes.tallies`). Listed, with every other step, in :mod:`.migrations`."""

from __future__ import annotations

from typing import Any

from ..writes.tallies import FAMILIES, apply_deltas, running_tables
from .tables import script

__all__ = ["v6", "v8", "v10", "v12", "postgres_v12", "DAY_INDEXES"]

# Version 6: ``rollup_days``, the roll-ups summed over the fleet per day, so a fleet-wide series over a year of
# pruned days reads one row a day, not one per device and family.
_V6 = """
CREATE TABLE IF NOT EXISTS rollup_days (
    day INTEGER PRIMARY KEY,
    executions INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    test_s REAL NOT NULL
);
INSERT OR IGNORE INTO rollup_days(day, executions, failures, test_s)
    SELECT day, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM rollups GROUP BY day
"""


# Version 8: per-day tallies of the rows still held, so a report over a window reads whole days from tallies and
# only the partial first day from rows. ``day_tallies`` holds, per UTC day (of a row's ``started_at``), device and
# family, exactly what the rows of ``results`` add up to (first-attempt executions, their failures, testing
# seconds with retests), kept in the same transaction as every write of rows: a batch of a scan
# (:meth:`~..scans.Scans.record`), a merge (minus the rows it replaces, plus the rows it writes), a prune (minus the
# rows it deletes). Its key leads with the device, so a GROUP BY device reads it in order whatever the window.
# ``results_time`` (led by ``started_at``) replaces ``results_rates``: the rows a query still reads are a time
# range (the partial first day of a window, a plot's bins), never a device's whole history. ``scans_device``
# gains ``executions``: a scan counts only when it executed something (``COUNTED_SCAN``), and the report's scan
# counts stay index-only.
_V8 = """
CREATE TABLE IF NOT EXISTS day_tallies (
    device TEXT NOT NULL,
    family TEXT NOT NULL,
    day INTEGER NOT NULL,
    executions INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    test_s REAL NOT NULL,
    PRIMARY KEY (device, family, day)
) WITHOUT ROWID;
DELETE FROM day_tallies;
INSERT INTO day_tallies(device, family, day, executions, failures, test_s)
    SELECT device, family, CAST(started_at / 86400.0 AS INTEGER) AS d, TOTAL((attempt = 0) * executions),
      TOTAL(attempt = 0 AND passed = 0), TOTAL(duration_s) FROM results GROUP BY device, family, d;
DROP INDEX IF EXISTS results_rates;
CREATE INDEX IF NOT EXISTS results_time ON results(started_at, device, family, executions, duration_s);
DROP INDEX IF EXISTS scans_device;
CREATE INDEX scans_device ON scans(device, status, started_at, executions)
"""


# Version 10: the slowness statistic's inputs as tallies, so a window reads two rows per device and case whatever its
# length. ``case_tallies`` holds, per device, golden case and UTC day (of a row's ``started_at``) on which something
# changed, the *running totals* of passing first executions and their device seconds through the end of that
# day; ``case_totals`` the same through the key's last such day (``day``), its first (``first``), and the case's
# family. With daily scans
# a per-day amount is as many rows as ``results`` holds (one per scan and case); a running total makes any window
# "the totals less the running total on the eve of its first whole day". The tallies' key leads with the device,
# then the day: a window's eve rows of one device lie together (a report's lookups touch a page per device, not
# one per device and case). Kept in the same transactions as the rows (a scan's batch, a merge); a prune deletes
# no tally (the executions it removes still count in the totals) and keeps of the days before the horizon only
# each device and case's latest running total, the one a window that starts at the horizon subtracts. Computed
# here from the rows held (what an older store pruned before has no case for). ``results_time`` gains
# ``case_id``, ``passed`` and ``attempt``: the partial first day of a window reads its passing first executions
# per case from the index alone.
_V10 = """
CREATE TABLE IF NOT EXISTS case_tallies (
    device TEXT NOT NULL,
    day INTEGER NOT NULL,
    case_id TEXT NOT NULL,
    executions INTEGER NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (device, day, case_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS case_totals (
    device TEXT NOT NULL,
    case_id TEXT NOT NULL,
    family TEXT NOT NULL,
    first INTEGER NOT NULL,
    day INTEGER NOT NULL,
    executions INTEGER NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (device, case_id)
) WITHOUT ROWID;
DELETE FROM case_tallies;
DELETE FROM case_totals;
DROP TABLE IF EXISTS temp._case_run;
CREATE TEMP TABLE _case_run (device TEXT, case_id TEXT, day INTEGER, family TEXT, n INTEGER, s REAL,
    PRIMARY KEY (device, case_id, day)) WITHOUT ROWID;
INSERT INTO temp._case_run(device, case_id, day, family, n, s)
    SELECT device, case_id, day, MIN(family) OVER k, SUM(n) OVER w, SUM(s) OVER w FROM (
      SELECT device, case_id, CAST(started_at / 86400.0 AS INTEGER) AS day, MIN(family) AS family,
        SUM(executions) AS n, TOTAL(duration_s) AS s
      FROM results WHERE passed = 1 AND attempt = 0 GROUP BY device, case_id, day)
    WINDOW w AS (PARTITION BY device, case_id ORDER BY day), k AS (PARTITION BY device, case_id);
INSERT INTO case_tallies(device, day, case_id, executions, seconds)
    SELECT device, day, case_id, n, s FROM temp._case_run ORDER BY device, day, case_id;
INSERT INTO case_totals(device, case_id, family, first, day, executions, seconds)
    SELECT device, case_id, family, (SELECT MIN(x.day) FROM temp._case_run x WHERE x.device = r.device
      AND x.case_id = r.case_id), MAX(day), n, s FROM temp._case_run r GROUP BY device, case_id;
DROP TABLE temp._case_run;
DROP INDEX IF EXISTS results_time;
CREATE INDEX results_time ON results(started_at, device, family, executions, duration_s, case_id, passed, attempt)
"""


_V12 = """
CREATE TABLE IF NOT EXISTS family_tallies (
    device TEXT NOT NULL,
    day INTEGER NOT NULL,
    family TEXT NOT NULL,
    executions INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    test_s REAL NOT NULL,
    PRIMARY KEY (device, day, family)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS family_totals (
    device TEXT NOT NULL,
    family TEXT NOT NULL,
    first INTEGER NOT NULL,
    day INTEGER NOT NULL,
    executions INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    test_s REAL NOT NULL,
    PRIMARY KEY (device, family)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS scans_counted ON scans(device, started_at, id, finished_at)
    WHERE status = 'complete' AND executions >= 1;
DELETE FROM family_tallies;
DELETE FROM family_totals
"""


DAY_INDEXES = (
    "CREATE INDEX IF NOT EXISTS family_tallies_day ON family_tallies(day, device, family, executions, failures, "
    "test_s)",
    "CREATE INDEX IF NOT EXISTS case_tallies_day ON case_tallies(day, device, case_id, executions, seconds)",
)
"""A server store's day-led indexes over both kinds of running totals: a window's eve rows read in day order, so
PostgreSQL merge-joins them with the totals (90 ms instead of 450 ms of look-ups per key at 2,000 devices).
SQLite has no merge join: it looks each eve row up by its key either way, so its stores go without them (16% of a
fleet file, and a second index to write with every running total)."""


def v12(conn: Any) -> None:
    """Schema version 12 on either backend (``conn``: SQLite's connection, or the server's that speaks the same
    SQL): the family tallies, computed from the day tallies (the rows held; a day before the horizon lands on its
    eve); and ``scans_counted``, the complete scans that count (:data:`~.tables.COUNTED_SCAN`, the same condition word
    for word, or SQLite could not use it) in the order a device's latest is found in, with its end: one index entry
    per device, no table row. (A server adds :data:`DAY_INDEXES`.)"""
    for statement in _V12.split(";\n"):
        conn.execute(statement)
    running_tables(conn)
    conn.execute(
        "INSERT INTO temp.family_delta(device, family, day, executions, failures, test_s) "
        "SELECT device, family, day, executions, failures, test_s FROM main.day_tallies"
    )
    apply_deltas(conn, FAMILIES)


_TABLE_RIGHTS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


def postgres_v12(conn: Any) -> None:
    """The family tallies and ``scans_counted``, as on SQLite (:func:`v12`: the same SQL text), and the day-led
    indexes a server's merge joins read (:data:`DAY_INDEXES`); the roles granted on the day tallies get the same
    rights on the two new tables (a writer's scans write them), so an upgrade needs no second ``db grant``. The
    server quotes the grant's names (``format``'s ``%I``): psycopg is imported by :mod:`..postgres` alone."""
    v12(conn)
    for statement in DAY_INDEXES:
        conn.execute(statement)
    grants = conn.execute(
        "SELECT grantee, privilege_type FROM information_schema.role_table_grants WHERE table_schema = "
        "current_schema() AND table_name = 'day_tallies' AND grantee <> current_user"
    ).fetchall()
    for grantee, privilege in grants:
        for table in ("family_tallies", "family_totals"):
            if privilege not in _TABLE_RIGHTS or (privilege == "DELETE" and table == "family_totals"):
                continue  # (a writer deletes running totals by day, never a key's totals)
            (statement,) = conn.execute(
                "SELECT format('GRANT %s ON %I TO %I', CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT))",
                (privilege, table, grantee),
            )
            conn.execute(statement[0])


v6 = script(_V6)
v8 = script(_V8)
v10 = script(_V10)
