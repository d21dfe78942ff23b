"""SQLite's backend of the fleet store: one connection to the store's file, opened with care, one ``BEGIN
IMMEDIATE`` transaction per write.

The file is checked before SQLite opens it (:mod:`.files`). Every write runs in one ``BEGIN IMMEDIATE`` transaction:
it takes the write lock up front, so concurrent writers (several scanner processes, a training job) wait on the busy
timeout instead of failing half-way with "database is locked", and a process killed at any moment leaves the store as
it was before or after the write. An older store is migrated forward (:func:`~..schema.migrations.migrate`) in one
transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from .... import __version__
from ....errors import SchemaTooNew, StoreError
from ..schema.migrations import SCHEMA_VERSION, migrate
from ..schema.tables import APPLICATION_ID
from . import files
from .files import check_header, check_intact, damaged, read_only_uri, too_new, writable_problem

__all__ = ["SqliteBackend"]


class SqliteBackend:
    """One SQLite connection to the store's file: opened with care (:meth:`open`), one ``BEGIN IMMEDIATE``
    transaction per write. One belongs to one thread."""

    kind: Literal["sqlite"] = "sqlite"

    def __init__(self, conn: sqlite3.Connection, path: Path, timeout_s: float) -> None:
        self.conn = conn
        self.path = path
        self.name = str(path)
        self._timeout_s = timeout_s
        self.read_only_reason: str | None = None
        """Why this store was opened read-only (None: opened for writing)."""

    @classmethod
    def open(cls, path: Path, *, create: bool, timeout_s: float, readonly: bool) -> SqliteBackend:
        """Open the store's file with the checks of :mod:`.files` (see :meth:`~..store.Store.open`); create or
        migrate it unless ``readonly``."""
        p = path
        size = check_header(p)
        if size < 0 and not create:
            raise StoreError(f"no fleet store at {p} (run `sdcguard scan` first, or pass --db / $SDCGUARD_DB)")
        problem = writable_problem(p)
        if problem and not readonly:
            what = "is read-only" if size >= 0 else "cannot be created"
            raise StoreError(f"fleet store {p} {what}: {problem}; this command writes to it (pass a writable --db)")
        try:
            if problem:
                conn = sqlite3.connect(
                    read_only_uri(p), uri=True, timeout=timeout_s, isolation_level=None, check_same_thread=False
                )
            else:
                conn = sqlite3.connect(str(p), timeout=timeout_s, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open fleet store {p}: {e}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            backend = cls(conn, p, timeout_s)
            backend.read_only_reason = problem
            backend._prepare(create=create, check=size > 0 and (not readonly or size <= files.CHECK_READS_UP_TO))
        except BaseException:
            conn.close()
            raise
        return backend

    def _prepare(self, *, create: bool, check: bool) -> None:
        p = self.path
        try:
            # One read transaction: a consistent snapshot even while another process creates the store.
            self.retry(lambda: self.conn.execute("BEGIN"))
            try:
                version = self.conn.execute("PRAGMA user_version").fetchone()[0]
                app = self.conn.execute("PRAGMA application_id").fetchone()[0]
                tables = self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            finally:
                self.conn.execute("ROLLBACK")
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(too_new(p, version))
            if app != APPLICATION_ID:
                if tables or version:
                    raise StoreError(f"{p} is a SQLite database but not an sdcguard fleet store; pass another --db")
                if not create:
                    raise StoreError(f"{p} is an empty file, not a fleet store; pass another --db")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{p} is not an sdcguard fleet store ({e}); pass another --db") from None
        if check and app == APPLICATION_ID:
            self.retry(lambda: check_intact(self.conn, p))  # before SQLite writes anything (WAL, migrations)
        if self.read_only_reason is not None:
            if version < SCHEMA_VERSION:
                raise StoreError(
                    f"fleet store {p} has the older schema {version} and is read-only here "
                    f"({self.read_only_reason}): let its owner open it once with this sdcguard to migrate it"
                )
            return  # read-only: nothing to set up, nothing to migrate
        # Only now (the file is ours, or empty) may SQLite write to it.
        self.retry(lambda: self.conn.execute("PRAGMA journal_mode = WAL").fetchone())
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        if version < SCHEMA_VERSION:
            with self.write() as conn:
                current = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
                if current > SCHEMA_VERSION:
                    raise SchemaTooNew(too_new(p, current))
                if current < SCHEMA_VERSION:
                    migrate(conn, current)
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES ('created_by', ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (f"sdcguard {__version__}",),
                    )

    def retry(self, fn: Any) -> Any:
        # The busy timeout covers ordinary lock waits; a few operations (switching to WAL, the first read of a
        # fresh WAL file while another process creates it) can report "locked" at once under contention, so
        # retry those with backoff, but never wait longer than the busy timeout in all.
        deadline = time.monotonic() + self._timeout_s
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                text = str(e)
                if "locked" not in text and "busy" not in text:
                    raise StoreError(f"fleet store {self.path}: {text}") from None
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"fleet store {self.path} stayed locked by another process for over {self._timeout_s:g} s"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); rolled back if the body raises."""
        if self.read_only_reason is not None:
            raise StoreError(f"fleet store {self.path} is read-only ({self.read_only_reason}): cannot write to it")
        self.retry(lambda: self.conn.execute("BEGIN IMMEDIATE"))
        try:
            yield self.conn
        except sqlite3.OperationalError as e:
            self.conn.execute("ROLLBACK")
            if "readonly" in str(e):  # a read-only mount, or permissions changed since the store was opened
                raise StoreError(f"fleet store {self.path} is read-only: {e}") from None
            raise
        except sqlite3.DatabaseError as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if type(e) is not sqlite3.DatabaseError:  # a constraint, a value it cannot bind: the caller's error
                raise
            raise damaged(self.path, str(e)) from None
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        try:
            self.retry(lambda: self.conn.execute("COMMIT"))
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def fetch(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            cur = self.conn.execute(sql, params)
            return [d[0] for d in cur.description or ()], cur.fetchall()
        except sqlite3.DatabaseError as e:
            raise self._read_error(e) from None

    def _read_error(self, e: sqlite3.DatabaseError) -> Exception:
        if isinstance(e, sqlite3.OperationalError):
            return StoreError(f"fleet store {self.path}: {e}")
        if type(e) is not sqlite3.DatabaseError:  # a value it cannot bind, a misuse: the caller's error
            return e
        return damaged(self.path, str(e))  # "database disk image is malformed" and its kin

    def lock(self, scope: str, keys: Iterable[str] = ("",), *, shared: bool = False) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already makes every write transaction the only one."""

    def vacuum(self) -> None:
        self.retry(lambda: self.conn.execute("VACUUM"))

    def analyze(self, temp_table: str) -> None:
        """Nothing: SQLite's plans of the store's temporary tables need no statistics."""

    def refresh_statistics(self) -> None:
        """Nothing: SQLite's plans follow its indexes (and ``INDEXED BY``)."""

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:
            pass
