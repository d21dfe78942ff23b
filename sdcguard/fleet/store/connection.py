"""Opening the fleet store with care, and its transactions: a SQLite file here (:class:`SqliteBackend`), a
PostgreSQL server in :mod:`.postgres` (:class:`Backend` is what both offer :class:`StoreBase`).

The file header is read *before* SQLite opens the file, so a text file, a foreign SQLite database or a store
written by a newer sdcguard is refused with one sentence and left byte-for-byte untouched. Every write runs in
one ``BEGIN IMMEDIATE`` transaction: it takes the write lock up front, so concurrent writers (several scanner
processes, a training job) wait on the busy timeout instead of failing half-way with "database is locked", and a
process killed at any moment leaves the store as it was before or after the write.

:class:`StoreBase` is the part of :class:`sdcguard.fleet.store.store.Store` every other part builds on.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal, Protocol, Self

from ... import __version__
from ...entry import is_server_url
from ...errors import SchemaTooNew, StoreError
from .schema import APPLICATION_ID, SCHEMA_VERSION, SQLITE_MAGIC, migrate
from .versions import ADD_ONE

__all__ = [
    "StoreBase",
    "Backend",
    "SqliteBackend",
    "check_header",
    "check_merge_input",
    "check_intact",
    "damaged",
    "read_only_uri",
    "writable_problem",
    "BUSY_TIMEOUT_S",
    "CHECK_READS_UP_TO",
]

BUSY_TIMEOUT_S = 30.0

CHECK_READS_UP_TO = 256 << 20
"""A store opened only to be read is checked whole (``PRAGMA quick_check``, about 0.4 s for this many bytes on a
2-core machine) when it is at most this large; a larger one (a fleet store of thousands of devices, where the
report's goal is 2 s) is refused as damaged when a read meets the damage. A store opened for writing is always
checked whole first: nothing is ever written into a damaged store."""


def damaged(path: Path, detail: str) -> StoreError:
    """The one-line refusal of a store whose file is damaged past its header (a bad disk, a partial copy)."""
    return StoreError(
        f"fleet store {path} is damaged ({detail}) and was left as it is: recover its rows with "
        f"`sqlite3 {path} .recover | sqlite3 recovered.db`, or restore a backup"
    )


def check_intact(conn: sqlite3.Connection, path: Path) -> None:
    """Raise :func:`damaged` unless SQLite's ``quick_check`` finds every page of the store well formed (it only
    reads: the file is not changed)."""
    try:
        rows = conn.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e)):
            raise
        raise damaged(path, str(e)) from None
    if rows != [("ok",)]:
        raise damaged(path, " ".join(str(rows[0][0]).split()) if rows else "no answer from quick_check")


def check_header(path: Path) -> int:
    """Refuse what cannot be an sdcguard store before SQLite opens it; return the file's size (-1: missing)."""
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a fleet store file")
    parent = path.parent
    if not parent.is_dir():
        what = f"{parent} is not a directory" if parent.exists() else f"directory {parent} does not exist"
        raise StoreError(f"cannot open fleet store {path}: {what}")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return -1
    except PermissionError:
        raise StoreError(f"cannot read fleet store {path}: permission denied") from None
    except OSError as e:
        raise StoreError(f"cannot read fleet store {path}: {e.strerror or e}") from None
    if not header:
        return 0
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise StoreError(f"{path} is not an sdcguard fleet store (not a SQLite database); pass another --db")
    version = int.from_bytes(header[60:64], "big")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(_too_new(path, version))
    return size


def _too_new(path: Path, version: int) -> str:
    return (
        f"{path} was written by a newer sdcguard (schema {version}; this one reads up to {SCHEMA_VERSION}): "
        "upgrade sdcguard to use it"
    )


def writable_problem(path: Path) -> str | None:
    """Why this process cannot write the store at ``path`` (None: it can). SQLite in WAL mode writes the file
    and creates ``-wal`` and ``-shm`` beside it, so the directory must be writable too."""
    parent = path.resolve().parent
    if path.exists() and not os.access(path, os.W_OK):
        return f"the file is read-only for this user ({_owner(path)})"
    if not os.access(parent, os.W_OK):
        return f"its directory {parent} is read-only for this user ({_owner(parent)})"
    return None


def _owner(path: Path) -> str:
    st = path.stat()
    try:
        import pwd

        owner = pwd.getpwuid(st.st_uid).pw_name
    except (KeyError, ImportError):
        owner = str(st.st_uid)
    return f"owner {owner}, mode {st.st_mode & 0o777:o}"


def read_only_uri(path: Path) -> str:
    """A SQLite URI that reads the store at ``path`` without writing anything, wherever it lies.

    ``mode=ro`` reads a WAL database when SQLite can open or create its ``-shm`` file (a writable directory, or
    one that exists). In a read-only directory without ``-shm``: when no ``-wal`` file holds writes, the database
    file has every committed row and ``immutable=1`` reads it (no locks, no ``-shm``); when one does,
    :class:`StoreError` says how to make it readable (``immutable`` would ignore those writes).
    """
    resolved = path.resolve()
    base = "file:" + urllib.parse.quote(str(resolved))
    shm, wal = Path(f"{resolved}-shm"), Path(f"{resolved}-wal")
    if os.access(resolved.parent, os.W_OK) or shm.exists():
        return base + "?mode=ro"
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(
            f"cannot read fleet store {path} in place: its directory is read-only and {wal.name} holds writes not "
            f"yet in the store file (SQLite needs {shm.name} to read them); let its owner open it once (e.g. "
            f"`sdcguard --db {path} report`), or copy {path.name} with {wal.name} to a writable directory"
        )
    return base + "?immutable=1"


def check_merge_input(path: Path) -> None:
    """Refuse a merge input that is missing, not a store, or of another schema version, without writing to it."""
    if not path.exists():
        raise StoreError(f"merge input {path} does not exist")
    if check_header(path) <= 0:
        raise StoreError(f"merge input {path} is empty, not a fleet store")
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app = conn.execute("PRAGMA application_id").fetchone()[0]
            if app == APPLICATION_ID:
                check_intact(conn, path)  # a merge reads every row of its inputs: a damaged one is refused whole
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"merge input {path} cannot be read as a fleet store: {e}") from None
    if app != APPLICATION_ID:
        raise StoreError(f"merge input {path} is a SQLite database but not an sdcguard fleet store")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"merge input {path} was written by a newer sdcguard (schema {version}); upgrade sdcguard")
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"merge input {path} has the older schema {version}: open it once with this sdcguard "
            f"(`sdcguard --db {path} report`) to migrate it, then merge"
        )


class Backend(Protocol):
    """What :class:`StoreBase` needs of a database: SQLite's file (:class:`SqliteBackend`) or a PostgreSQL server
    (:class:`~.postgres.connection.PostgresBackend`). ``conn`` runs the store's SQL text in both (``execute``,
    ``executemany``, cursors with ``fetchone``/``fetchall``/``rowcount``)."""

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
        """The checks and the opening of :meth:`StoreBase.open` for a file."""
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
            backend._prepare(create=create, check=size > 0 and (not readonly or size <= CHECK_READS_UP_TO))
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
                raise SchemaTooNew(_too_new(p, version))
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
                    raise SchemaTooNew(_too_new(p, current))
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


class StoreBase:
    """The connection, its opening and its transactions. One belongs to one thread: open one per process."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._conn = backend.conn
        self.path: str | Path = getattr(backend, "path", backend.name)
        """The store's file, or (a server) its URL without credentials: what messages name."""
        self._known_digests: set[tuple[str, str]] = set()
        """``(case, digest)`` pairs this connection knows ``pass_digests`` holds (rows are never deleted)."""
        self._known_devices: set[str] = set()
        """Devices this connection knows the ``devices`` table holds (rows are never deleted)."""

    @property
    def backend(self) -> Literal["sqlite", "postgresql"]:
        """Which database holds this store: a SQLite file or a PostgreSQL server."""
        return self._backend.kind

    @property
    def read_only_reason(self) -> str | None:
        """Why this store was opened read-only (None: opened for writing)."""
        return self._backend.read_only_reason

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        timeout_s: float = BUSY_TIMEOUT_S,
        readonly: bool = False,
        answer_within_s: float | None = None,
    ) -> Self:
        """Open (and with ``create``, create or migrate) the store at ``path``: a SQLite file, or a PostgreSQL
        server's ``postgresql://`` URL (:mod:`.postgres`; credentials come from libpq's environment or service
        file, never from the URL).

        ``readonly``: the caller only reads. A store this process may write is opened as usual (an older one is
        migrated); one it may not (a read-only file or directory) is opened read-only (:func:`read_only_uri`).
        Without ``readonly``, a store this process may not write is refused with one line saying so.

        Raises :class:`StoreError` (not SQLite, unreadable, read-only for a writer, missing directory, missing
        file without ``create``; a server that cannot be reached: :class:`~sdcguard.errors.StoreUnreachable`) or
        :class:`SchemaTooNew`; in every such case the store is left untouched. An older store is migrated forward
        in one transaction.

        ``timeout_s``: how long to wait for a lock (SQLite's busy timeout) or to connect (a server).
        ``answer_within_s``: a server's statements that take longer are cancelled
        (:class:`~sdcguard.errors.StoreUnreachable`): what a writer with a spool waits at most.
        """
        if is_server_url(path):
            from .postgres import open_server

            backend = open_server(
                str(path), create=create, timeout_s=timeout_s, readonly=readonly, answer_within_s=answer_within_s
            )
            return cls(backend)
        return cls(SqliteBackend.open(Path(path), create=create, timeout_s=timeout_s, readonly=readonly))

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> AbstractContextManager[Any]:
        """One write transaction; rolled back if the body raises."""
        return self._backend.write()

    def _lock_devices(self, devices: Iterable[str], *, changed: bool = True) -> None:
        """Inside a write: make this transaction the only one changing these devices' rows and tallies (a
        PostgreSQL store's concurrent writers; in SQLite every write is the only one), and (``changed``) add one
        to their versions (:mod:`.versions`): every write that changes what a report says of a device locks it
        first. A merge locks every device of its input up front, unchanged, and then those it changes."""
        ids = sorted(set(devices))
        self._backend.lock("tallies", (), shared=True)
        self._backend.lock("device", ids)
        if ids and changed:
            self._backend.conn.execute(ADD_ONE, (json.dumps(ids),))

    def _rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        return self._backend.fetch(sql, params)[1]

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        names, rows = self._backend.fetch(sql, params)
        return [dict(zip(names, row)) for row in rows]

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._backend.fetch(sql, params)[1]
        return rows[0][0] if rows else None

    def _meta(self, key: str) -> str | None:
        value = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if value is None else str(value)

    @property
    def store_id(self) -> str:
        """This store's identity (a uuid made when it was created): merges remember their inputs by it."""
        value = self._meta("store_id")
        assert value is not None, "every schema-4 store has a store_id"
        return value

    @property
    def pruned_before(self) -> float | None:
        """The retention horizon: scans that started before it live only in the daily roll-ups (None: never
        pruned)."""
        value = self._meta("pruned_before")
        return None if value is None else float(value)
