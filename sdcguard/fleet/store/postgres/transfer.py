"""A SQLite merge input (a node's store, a job's spool) copied into a PostgreSQL store's transaction, so the merge's
one SQL text (:mod:`..writes.merging`, which reads the input as ``src.<table>``) runs on the server unchanged.

SQLite ATTACHes the input; a server cannot open a file on the node, so the input is read here (one read transaction: a
consistent snapshot while its scanner keeps writing) and what the merge will read of it is copied (``COPY``) into this
connection's temporary tables ``pg_temp.src_<table>`` (emptied first): of the watermarked tables the rows from the
watermark on (the row *at* the watermark too, whose uuid :func:`~..writes.merging.check_marks` checks), of the scans
those past the watermark and those still open at the last merge with their results, of the small tables (devices,
digests, actions, checkpoints, scrubs, meta) every row. When the watermark does not hold
(:func:`~..writes.merging.check_marks` rewinds a table), that table is copied whole. The input's lock is taken first, so
two merges of one input (a spool forwarded twice at once) run one after the other.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..sqlite.files import read_only_uri
from ..writes.merging import WATERMARKED, check_marks, read_mark

__all__ = ["copy_merge_input", "COPIED"]

_ANALYZE_ROWS = 1000

COPIED = (
    "meta",
    "devices",
    "scans",
    "results",
    "pass_digests",
    "incidents",
    "incident_devices",
    "quarantine_history",
    "policy_decisions",
    "actions",
    "action_attempts",
    "checkpoints",
    "checkpoint_scrubs",
    "dcgm_results",
)
"""The input's tables a merge reads."""


def _where(table: str, after: dict[str, int], reopened: list[int]) -> tuple[str, list[Any]]:
    """Which rows of ``table`` the merge reads (every row of the others)."""
    if table == "scans":
        return "WHERE id >= ? OR id IN (SELECT value FROM json_each(?))", [after["scans"], json.dumps(reopened)]
    if table == "results":
        return (
            "WHERE scan IN (SELECT id FROM src.scans WHERE id > ? OR id IN (SELECT value FROM json_each(?)))",
            [after["scans"], json.dumps(reopened)],
        )
    if table in WATERMARKED:
        return "WHERE id >= ?", [after[table]]
    if table == "incident_devices":
        return "WHERE incident >= ?", [after["incidents"]]
    return "", []


def copy_merge_input(conn: Any, path: Path, *, full: bool, lock: Callable[..., None]) -> None:
    """Inside the output's transaction: fill ``pg_temp.src_<table>`` from the SQLite store at ``path``."""
    src = sqlite3.connect(":memory:", isolation_level=None)
    try:
        src.execute("ATTACH DATABASE ? AS src", (read_only_uri(path),))
        src.execute("BEGIN")
        source = src.execute("SELECT value FROM src.meta WHERE key = 'store_id'").fetchone()[0]
        lock("source", [source])
        after, remembered, reopened = read_mark(conn, source, full=full)
        check_marks(src, after, remembered)
        for table in COPIED:
            _copy(conn, src, table, after, reopened)
        src.execute("ROLLBACK")
    finally:
        src.close()


def _copy(conn: Any, src: sqlite3.Connection, table: str, after: dict[str, int], reopened: list[int]) -> None:
    columns = [r[1] for r in src.execute(f"PRAGMA src.table_info({table})")]
    names = ", ".join(columns)
    raw = conn.raw
    # One temporary table per input table and connection, emptied for each merge (cheaper than creating it).
    raw.execute(f"CREATE TEMP TABLE IF NOT EXISTS src_{table} (LIKE {table})")
    raw.execute(f"DELETE FROM pg_temp.src_{table}")
    where, params = _where(table, after, reopened)
    rows: Iterable[tuple[Any, ...]] = src.execute(f"SELECT {names} FROM src.{table} {where}", params)
    n = 0
    with raw.cursor().copy(f"COPY pg_temp.src_{table} ({names}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
            n += 1
    key = "scan, seq" if table == "results" else "id" if "id" in columns else None
    if key:
        raw.execute(f"CREATE INDEX IF NOT EXISTS src_{table}_key ON pg_temp.src_{table}({key})")
    if n > _ANALYZE_ROWS:  # the planner's guess for a temporary table it never analyzed is of a small one
        raw.execute(f"ANALYZE pg_temp.src_{table}")
