"""Devices' versions (schema version 13): a number per device, one more with every write that changes what a report
keeps of it (its results, scans and tallies, its identity, a merge of its scans or of a new identity), in that
write's transaction. Every such write locks the device first (:meth:`~.connection.StoreBase._lock_devices`), and
the lock adds the one, so no write can forget it; a new identity (:meth:`~.store.Store.upsert_devices`) adds one
too, and a recorded incident moves the devices it names (a report reads incidents live: status, slowness). A merge
locks every device of its input without moving it, then moves those it changes. A kept report
(:mod:`sdcguard.fleet.report.kept`) reads the versions before it computes its rows and again when it is read: a
device whose version moved is computed again."""

from __future__ import annotations

import sqlite3

__all__ = ["ADD_ONE", "add_versions"]

ADD_ONE = "UPDATE main.devices SET version = version + 1 WHERE id IN (SELECT value FROM json_each(?))"
"""One more on the version of each device of a JSON array (the store's SQL text, both backends)."""


def add_versions(conn: sqlite3.Connection) -> None:
    """Schema version 13 on SQLite: the column, every device at 0. Idempotent, as every migration: a store stamped
    older than it is may have the column already. (A server's is :data:`~.postgres.schema.MIGRATIONS` 13.)"""
    if not any(r[1] == "version" for r in conn.execute("PRAGMA table_info(devices)").fetchall()):
        conn.execute("ALTER TABLE devices ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
