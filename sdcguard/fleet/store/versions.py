"""Devices' versions (schema version 13) on SQLite: the column (what moves it: :data:`~.core.ADD_ONE`)."""

from __future__ import annotations

import sqlite3

__all__ = ["add_versions"]


def add_versions(conn: sqlite3.Connection) -> None:
    """Schema version 13 on SQLite: the column, every device at 0. Idempotent, as every migration: a store stamped
    older than it is may have the column already. (A server's is :data:`~.postgres.schema.MIGRATIONS` 13.)"""
    if not any(r[1] == "version" for r in conn.execute("PRAGMA table_info(devices)").fetchall()):
        conn.execute("ALTER TABLE devices ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
