"""The training side's tables, both backends' steps: the checkpoints the guard saved (version 5), a checkpoint's
status and the scrubs of checkpoints at rest (9), a scrub's ``unverified`` outcome (11). Listed, with every other
step, in :mod:`.migrations`."""

from __future__ import annotations

import sqlite3
from typing import Any

from .tables import script

__all__ = ["v5", "v9", "v11", "postgres_v11"]

# Version 5: the checkpoints the training guard saved (``sdcguard.checkpoint.save`` with a guard, the Lightning
# and HF adapters): id, step, whether every rank's checks vouched for the state, the fingerprint digest. Few rows
# (one per save); merged whole by ``uuid``.
_V5 = """
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    checkpoint_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    verified INTEGER NOT NULL,
    digest TEXT NOT NULL,
    job TEXT,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_time ON checkpoints(time)
"""


# Version 9: a checkpoint's ``status`` (``saved``, or ``failed``: an asynchronous save whose background write failed,
# never a place to roll back to) with its ``detail``; ``checkpoint_scrubs``, one row per checkpoint re-read at rest
# by ``sdcguard scrub`` (clean, corrupt with the tensors named, or unreadable). Merged whole by ``uuid``.
_V9_TABLES = """
CREATE TABLE IF NOT EXISTS checkpoint_scrubs (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    checkpoint_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('clean','corrupt','unreadable')),
    tensors INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    bad TEXT NOT NULL DEFAULT '[]',
    detail TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoint_scrubs_checkpoint ON checkpoint_scrubs(checkpoint_id, time)
"""


def v9(conn: sqlite3.Connection) -> None:
    columns = {r[1] for r in conn.execute("PRAGMA table_info(checkpoints)")}
    if "status" not in columns:  # (a store stamped back to an older version by hand still has them)
        conn.execute(
            "ALTER TABLE checkpoints ADD COLUMN status TEXT NOT NULL DEFAULT 'saved' "
            "CHECK (status IN ('saved','failed'))"
        )
    if "detail" not in columns:
        conn.execute("ALTER TABLE checkpoints ADD COLUMN detail TEXT NOT NULL DEFAULT ''")
    script(_V9_TABLES)(conn)


# Version 11: a scrub's ``unverified`` outcome and the items it names; the table rebuilt for its CHECK, rows kept.
_V11 = """
CREATE TABLE checkpoint_scrubs_v11 (
    id INTEGER PRIMARY KEY, uuid TEXT NOT NULL UNIQUE, checkpoint_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('clean','corrupt','unreadable','unverified')),
    tensors INTEGER NOT NULL, bytes INTEGER NOT NULL, bad TEXT NOT NULL DEFAULT '[]',
    unverified TEXT NOT NULL DEFAULT '[]', detail TEXT NOT NULL DEFAULT '', host TEXT NOT NULL, time REAL NOT NULL
);
INSERT INTO checkpoint_scrubs_v11(id, uuid, checkpoint_id, status, tensors, bytes, bad, detail, host, time)
    SELECT id, uuid, checkpoint_id, status, tensors, bytes, bad, detail, host, time FROM checkpoint_scrubs;
DROP TABLE checkpoint_scrubs;
ALTER TABLE checkpoint_scrubs_v11 RENAME TO checkpoint_scrubs;
CREATE INDEX checkpoint_scrubs_checkpoint ON checkpoint_scrubs(checkpoint_id, time)
"""


def postgres_v11(conn: Any) -> None:
    """A scrub's ``unverified`` outcome and the items it names. SQLite rebuilds the table for its CHECK; here the
    constraint is replaced and the column added in place (the rows, their ids and the roles' grants stay; the new
    column comes last, where SQLite's is after ``bad``: the store names every column it writes and reads)."""
    conn.raw.execute(
        "ALTER TABLE checkpoint_scrubs DROP CONSTRAINT IF EXISTS checkpoint_scrubs_status_check, "
        "ADD CONSTRAINT checkpoint_scrubs_status_check "
        "CHECK (status IN ('clean','corrupt','unreadable','unverified')), "
        "ADD COLUMN IF NOT EXISTS unverified TEXT NOT NULL DEFAULT '[]'"
    )


v5 = script(_V5)
v11 = script(_V11)
