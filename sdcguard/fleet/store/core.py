"""The store's core, which every job of :class:`~.store.Store` is composed over: the :class:`Backend` a database
offers (SQLite's file, :mod:`.sqlite.backend`; a PostgreSQL server, :mod:`.postgres.connection`), its transactions,
the device lock that moves devices' versions, and the ``meta`` table's facts.

One :class:`StoreCore` per connection, shared by the jobs of one store: a job reads through :meth:`StoreCore.rows`
(and its kin) and writes in :meth:`StoreCore.write`'s transaction, taking :meth:`StoreCore.lock_devices` first when
the write changes what a report says of a device. One belongs to one thread.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, Protocol

from ...durations import DAY_S
from ...entry import is_server_url
from .sqlite.backend import SqliteBackend

__all__ = [
    "Backend",
    "StoreCore",
    "open_backend",
    "where_clause",
    "in_devices",
    "first_day",
    "ADD_ONE",
    "BUSY_TIMEOUT_S",
]

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another process's lock (SQLite's busy timeout), or to connect (a server)."""

ADD_ONE = "UPDATE main.devices SET version = version + 1 WHERE id IN (SELECT value FROM json_each(?))"
"""One more on the version of each device of a JSON array (the store's SQL text, both backends).

Devices' versions (schema version 13): a number per device, one more with every write that changes what a report
keeps of it (its results, scans and tallies, its identity, a merge of its scans or of a new identity), in that
write's transaction. Every such write locks the device first (:meth:`StoreCore.lock_devices`), and the lock adds the
one, so no write can forget it; a new identity (:meth:`~.scans.Scans.record_devices`) adds one too, and a recorded
incident moves the devices it names (a report reads incidents live: status, slowness). A merge locks every device
of its input without moving it, then moves those it changes. A kept report (:mod:`sdcguard.fleet.report.kept`)
reads the versions before it computes its rows and again when it is read: a device whose version moved is computed
again."""


class Backend(Protocol):
    """What :class:`StoreCore` needs of a database: SQLite's file (:class:`~.sqlite.backend.SqliteBackend`) or a
    PostgreSQL server (:class:`~.postgres.connection.PostgresBackend`). ``conn`` runs the store's SQL text in both
    (``execute``, ``executemany``, cursors with ``fetchone``/``fetchall``/``rowcount``)."""

    @property
    def kind(self) -> Literal["sqlite", "postgresql"]: ...

    conn: Any
    name: str
    read_only_reason: str | None

    def write(self) -> AbstractContextManager[Any]: ...

    def fetch(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        """A read's column names and rows, errors as one line."""
        ...

    def lock(self, scope: str, keys: Iterable[str] = ("",), *, shared: bool = False) -> None: ...

    def vacuum(self) -> None: ...

    def analyze(self, temp_table: str) -> None:
        """Inside a transaction: give the planner the statistics of a temporary table just filled."""
        ...

    def refresh_statistics(self) -> None:
        """After a merge: the planner's statistics of the tables it changed much."""
        ...

    def close(self) -> None: ...


def open_backend(
    path: str | os.PathLike[str],
    *,
    create: bool = True,
    timeout_s: float = BUSY_TIMEOUT_S,
    readonly: bool = False,
    answer_within_s: float | None = None,
) -> Backend:
    """The backend of the store at ``path``: a SQLite file, or a PostgreSQL server's ``postgresql://`` URL
    (:func:`~.postgres.open_server`, imported only then: psycopg is an optional dependency, its absence one line
    naming the extra). See :meth:`~.store.Store.open` for the arguments."""
    if is_server_url(path):
        from .postgres import open_server

        return open_server(
            str(path), create=create, timeout_s=timeout_s, readonly=readonly, answer_within_s=answer_within_s
        )
    return SqliteBackend.open(Path(path), create=create, timeout_s=timeout_s, readonly=readonly)


def where_clause(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """``WHERE`` joining the conditions whose value is not None, and their parameters: each is ``(sql, value)``,
    the value bound to the condition's ``?`` (a condition without one is a flag, on when its value is not None)."""
    kept = [(sql, value) for sql, value in conditions if value is not None]
    if not kept:
        return "", []
    return "WHERE " + " AND ".join(sql for sql, _ in kept), [value for sql, value in kept if "?" in sql]


def in_devices(devices: Iterable[str] | None, column: str = "device") -> tuple[str, list[Any]]:
    """``AND column IN (...)`` for an optional device list (one JSON parameter, any length)."""
    if devices is None:
        return "", []
    return f" AND {column} IN (SELECT value FROM json_each(?))", [json.dumps(list(devices))]


def first_day(since: float | None) -> int | None:
    """The first roll-up day (UTC days since the epoch) that counts in a window starting at ``since``: beyond the
    retention horizon a window's start is resolved to the UTC day."""
    return None if since is None else math.ceil(since / DAY_S)


class StoreCore:
    """One connection's transactions, locks and reads, which the store's jobs share.

    Args:
        backend: the opened database (:func:`open_backend`).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.path: str | Path = getattr(backend, "path", backend.name)
        """The store's file, or (a server) its URL without credentials: what messages name."""

    @property
    def kind(self) -> Literal["sqlite", "postgresql"]:
        """Which database holds this store: a SQLite file or a PostgreSQL server."""
        return self.backend.kind

    def write(self) -> AbstractContextManager[Any]:
        """One write transaction; rolled back if the body raises. Yields the connection."""
        return self.backend.write()

    def lock_devices(self, devices: Iterable[str], *, changed: bool = True) -> None:
        """Inside a write: make this transaction the only one changing these devices' rows and tallies (a
        PostgreSQL store's concurrent writers; in SQLite every write is the only one), and (``changed``) add one
        to their versions (:data:`ADD_ONE`): every write that changes what a report says of a device locks it
        first. A merge locks every device of its input up front, unchanged, and then those it changes."""
        ids = sorted(set(devices))
        self.backend.lock("tallies", (), shared=True)
        self.backend.lock("device", ids)
        if ids and changed:
            self.backend.conn.execute(ADD_ONE, (json.dumps(ids),))

    def rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        """A read's rows."""
        return self.backend.fetch(sql, params)[1]

    def dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """A read's rows as ``column -> value``."""
        names, rows = self.backend.fetch(sql, params)
        return [dict(zip(names, row)) for row in rows]

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of a read's first row (None: no row)."""
        rows = self.backend.fetch(sql, params)[1]
        return rows[0][0] if rows else None

    def meta(self, key: str) -> str | None:
        """A value of the ``meta`` table (None: not set)."""
        value = self.one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if value is None else str(value)

    @property
    def pruned_before(self) -> float | None:
        """The retention horizon: scans that started before it live only in the daily roll-ups (None: never
        pruned)."""
        value = self.meta("pruned_before")
        return None if value is None else float(value)

    def has_rollups(self, since: float | None) -> bool:
        """Whether the roll-ups of pruned days hold a day that counts in a window starting at ``since``."""
        last = self.meta("rollup_last_day")
        if last is None:
            return False
        day = first_day(since)
        return day is None or int(last) >= day

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self.backend.close()
