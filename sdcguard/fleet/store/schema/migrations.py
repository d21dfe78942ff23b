"""Every migration of the fleet store, both backends, listed in one place: ``version -> step`` bringing a store from
``version - 1`` to ``version``, each run in one transaction.

A SQLite store runs every step of :data:`SQLITE_MIGRATIONS` from its version on (:func:`migrate`). A PostgreSQL store
begins at :data:`BASE_VERSION`: its tables are those a SQLite store has after the steps up to it, read from SQLite's
own catalogue and spelled for PostgreSQL (:func:`~..postgres.schema.tables_ddl`), so the two schemas cannot drift
apart; every later version has its step in both lists (the tests hold that, and that both backends then have the
same columns). The steps' SQL lives with the tables it changes: :mod:`.tables` (the record), :mod:`.tally_tables`
(the running totals), :mod:`.checkpoints` (the training side's).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from . import checkpoints, diagnostics, tables, tally_tables
from .tables import APPLICATION_ID

__all__ = ["SCHEMA_VERSION", "BASE_VERSION", "SQLITE_MIGRATIONS", "POSTGRES_MIGRATIONS", "migrate"]

SCHEMA_VERSION = 14
"""The version this sdcguard writes and reads up to."""
BASE_VERSION = 10
"""The schema version a new PostgreSQL store starts at (SQLite's migrations up to it are history)."""

SQLITE_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: tables.v1,  # the record: devices, scans, results, incidents, quarantine and its history, decisions, actions
    2: tables.v2,  # leaner indexes for the report
    3: tables.v3,  # a result row may stand for several passing executions
    4: tables.v4,  # the store at fleet scale: folded passes, roll-ups, merge watermarks, pass digests
    5: checkpoints.v5,  # the checkpoints the guard saved
    6: tally_tables.v6,  # the roll-ups summed over the fleet per day
    7: tables.v7,  # merge watermarks that notice an input going backwards
    8: tally_tables.v8,  # the day tallies
    9: checkpoints.v9,  # a checkpoint's status; scrubs
    10: tally_tables.v10,  # the case tallies (the slowness statistic's running totals)
    11: checkpoints.v11,  # a scrub's unverified outcome
    12: tally_tables.v12,  # the family tallies (the rates' running totals) and scans_counted
    13: tables.v13,  # each device's version
    14: diagnostics.v14,  # DCGM's diagnostics, a second opinion per GPU
}
"""SQLite's steps, from version 1."""

POSTGRES_MIGRATIONS: dict[int, Callable[[Any], None]] = {
    11: checkpoints.postgres_v11,
    12: tally_tables.postgres_v12,
    13: tables.postgres_v13,
    14: diagnostics.postgres_v14,
}
"""PostgreSQL's steps past :data:`BASE_VERSION` (the same change as SQLite's step of that version), each given the
server's connection (:class:`~..postgres.connection.PgConnection`)."""


def migrate(conn: sqlite3.Connection, current: int, *, upto: int = SCHEMA_VERSION) -> None:
    """Apply every SQLite step after ``current`` up to ``upto`` inside the caller's transaction; stamp the version."""
    for version in range(current + 1, upto + 1):
        SQLITE_MIGRATIONS[version](conn)
    conn.execute(f"PRAGMA user_version = {upto}")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
