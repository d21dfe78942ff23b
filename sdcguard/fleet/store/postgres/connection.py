"""Opening a fleet store on a PostgreSQL server, and its transactions (psycopg 3).

The ``--db`` URL names the server, the database and, optionally, the schema (``?options=-csearch_path%3Dname``);
everything else comes from libpq as usual: ``$PGHOST``, ``$PGUSER``, ``$PGPASSWORD``/``~/.pgpass``, a service
file (``?service=name``, ``$PGSERVICE``) and TLS (``sslmode``, ``sslrootcert``, ``sslcert``/``sslkey``, in the URL
or as ``$PGSSLMODE``...), passed through untouched. A password in the URL itself is refused: a command line is
visible to every user of the machine (``ps``), and the store keeps no credential.

Every write is one transaction (READ COMMITTED). Concurrent writers (hundreds of scanners and jobs, a
connection each) take no table lock: each transaction that changes a device's rows and running totals first takes
that device's transaction-level advisory lock (sorted, so two writers never wait on each other in a circle), a
quarantine change the store-wide quarantine lock, a merge its input's lock; a prune takes the tallies' lock
exclusively where every other writer takes it shared (:meth:`PostgresBackend.lock`). The order is always source,
tallies, devices, quarantine.

A server that cannot be reached, drops the connection or does not answer within the timeout raises
:class:`~sdcguard.errors.StoreUnreachable` (a writer with a spool writes there instead); any other
database error :class:`~sdcguard.errors.StoreError`, one line.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.adapt import Loader

from .... import __version__
from ....errors import SchemaTooNew, StoreError, StoreUnreachable
from ..schema.migrations import SCHEMA_VERSION
from . import schema as pg_schema
from .dialect import to_postgres

__all__ = ["PostgresBackend", "PgConnection", "display_url", "lock_key", "connect_error"]

_LOCK_ORDER = ("source", "tallies", "device", "quarantine")


def lock_key(scope: str, key: str) -> int:
    """The advisory lock id (a signed 64-bit integer) of ``key`` in ``scope``."""
    digest = hashlib.blake2b(f"sdcguard:{scope}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def display_url(url: str) -> str:
    """The URL as messages show it (it holds no password: :meth:`PostgresBackend.open` refuses one)."""
    return url


class _NumericLoader(Loader):
    """``numeric`` (what PostgreSQL's ``SUM`` of ``BIGINT`` returns) as Python's ``int`` when whole, else ``float``:
    the values SQLite's sums give."""

    def load(self, data: Any) -> int | float:
        text = bytes(data)
        if b"." in text or b"e" in text or b"N" in text:
            return float(text)
        return int(text)


class PgConnection:
    """A psycopg connection that speaks the store's SQL text (:func:`~.dialect.to_postgres`), shaped like
    ``sqlite3.Connection``'s ``execute``/``executemany``."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> psycopg.Cursor[Any]:
        cur = self.raw.cursor()
        cur.execute(to_postgres(sql), params if params else None)
        return cur

    def executemany(self, sql: str, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> psycopg.Cursor[Any]:
        cur = self.raw.cursor()
        batch = list(rows)
        if batch:
            cur.executemany(to_postgres(sql), batch)
        return cur

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


_TRANSIENT_REFUSALS = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "too many connections",
    "remaining connection slots are reserved",
    "sorry, too many clients already",
)
"""What a server says when it refuses a connection for now, not for good (SQLSTATE 57P03 cannot_connect_now, 57P01
admin_shutdown, 53300 too_many_connections): an outage, like a server that does not answer."""


def connect_error(name: str, e: psycopg.Error) -> StoreError:
    """A failed connection as a permanent error (:class:`StoreError`: one line, exit 2, nothing spooled) or an outage
    (:class:`StoreUnreachable`: a writer spools and goes on).

    libpq gives no SQLSTATE for a connection it could not open (``e.sqlstate`` is None), only its message, so the
    line is drawn on what the message says. The server answered and refused (its message carries ``FATAL:``: a
    database or role that does not exist, failed authentication, no ``pg_hba.conf`` entry, a missing TLS
    certificate it demands): permanent, unless it refused for now (:data:`_TRANSIENT_REFUSALS`: starting up,
    shutting down, in recovery, too many connections). Nothing answered (connection refused, a timeout, a socket
    that does not exist, a host name that does not resolve, a connection closed before any answer): an outage."""
    text = _first_line(e)
    full = " ".join(str(e).split()).lower()
    if "fatal:" in full and not any(t in full for t in _TRANSIENT_REFUSALS):
        return StoreError(f"cannot open fleet store {name}: {text} (the server refused: check the --db URL)")
    if not isinstance(e, psycopg.OperationalError):
        return StoreError(f"cannot open fleet store {name}: {text}")
    return StoreUnreachable(f"cannot reach fleet store {name}: {text}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class PostgresBackend:
    """One connection to the store's database on a PostgreSQL server. One belongs to one thread."""

    kind: Literal["postgresql"] = "postgresql"

    def __init__(self, raw: psycopg.Connection[Any], url: str) -> None:
        self.conn = PgConnection(raw)
        self.name = display_url(url)
        self.read_only_reason: str | None = None

    @classmethod
    def open(
        cls, url: str, *, create: bool, timeout_s: float, readonly: bool, answer_within_s: float | None = None
    ) -> PostgresBackend:
        """Connect (libpq's settings), check it is a store (or create one), migrate an older one. ``timeout_s``:
        libpq's connect timeout (unless the URL or ``$PGCONNECT_TIMEOUT`` sets one); ``answer_within_s``: the
        session's ``statement_timeout``."""
        try:
            params = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as e:
            raise StoreError(f"--db {url!r} is not a PostgreSQL URL libpq can read: {_first_line(e)}") from None
        if params.get("password"):
            raise StoreError(
                "the --db URL holds a password, which every user of this machine can read on the command line; "
                "give it through ~/.pgpass, $PGPASSFILE, a service file (?service=NAME) or $PGPASSWORD instead"
            )
        extra: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params and not os.environ.get("PGCONNECT_TIMEOUT"):
            extra["connect_timeout"] = max(2, int(timeout_s))
        if "application_name" not in params and not os.environ.get("PGAPPNAME"):
            extra["application_name"] = "sdcguard"
        try:
            raw = psycopg.connect(url, **extra)
        except psycopg.Error as e:
            raise connect_error(display_url(url), e) from None
        raw.adapters.register_loader("numeric", _NumericLoader)
        backend = cls(raw, url)
        try:
            # The store's statements are short (a batch, a report's per-device sums over indexes); the planner's
            # cost estimates of the report's look-ups cross jit_above_cost, and compiling them took 0.2 s of a
            # 0.45 s query (measured, benchmarks/report_scale.py): no JIT for this session.
            raw.execute("SELECT set_config('jit', 'off', false)")
            if answer_within_s is not None:
                raw.execute("SELECT set_config('statement_timeout', %s, false)", (f"{int(answer_within_s * 1000)}",))
            backend._prepare(create=create, readonly=readonly)
        except BaseException:
            raw.close()
            raise
        return backend

    def _prepare(self, *, create: bool, readonly: bool) -> None:
        """As SQLite's: refuse what is not a store, create or migrate. ``readonly`` changes nothing here: on a
        server, what a command may write is its role's (``sdcguard db grant ROLE --reader``)."""
        name = self.name
        state = self._state()
        if state == "foreign":
            raise StoreError(
                f"{name} holds tables but is not an sdcguard fleet store; pass another --db (or another schema: "
                "?options=-csearch_path%3DNAME)"
            )
        if state == "empty":
            if not create:
                raise StoreError(f"no fleet store in {name} (run `sdcguard --db URL scan` or `... db init` first)")
            with self.write():
                self.lock("schema")
                if self._state() == "empty":  # another process may have created it meanwhile
                    pg_schema.create(self.conn, store_id=uuid.uuid4().hex, created_by=f"sdcguard {__version__}")
            return
        version = int(state)
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{name} was written by a newer sdcguard (schema {version}; this one reads up to "
                f"{SCHEMA_VERSION}): upgrade sdcguard to use it"
            )
        if version < SCHEMA_VERSION:
            with self.write():
                self.lock("schema")
                current = int(self._state())
                if current < SCHEMA_VERSION:
                    pg_schema.upgrade(self.conn, current)

    def _state(self) -> str:
        """``empty`` (no table in the schema), ``foreign`` (tables, but no sdcguard ``meta``), or the version."""
        try:
            cur = self.conn.raw.execute(
                "SELECT to_regclass('meta') IS NOT NULL, (SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = current_schema())"
            )
            has_meta, tables = cur.fetchone() or (False, 0)
            if not has_meta:
                return "empty" if not tables else "foreign"
            rows = dict(
                self.conn.raw.execute("SELECT key, value FROM meta WHERE key IN ('application', 'schema_version')")
            )
        except psycopg.OperationalError as e:
            raise StoreUnreachable(f"fleet store {self.name}: {_first_line(e)}") from None
        except psycopg.Error as e:
            raise StoreError(f"fleet store {self.name}: {_first_line(e)}") from None
        if rows.get("application") != pg_schema.APPLICATION or "schema_version" not in rows:
            return "foreign"
        return str(int(rows["schema_version"]))

    @contextmanager
    def write(self) -> Iterator[PgConnection]:
        """One transaction; rolled back if the body raises."""
        try:
            with self.conn.raw.transaction():
                yield self.conn
        except psycopg.OperationalError as e:
            raise StoreUnreachable(f"fleet store {self.name}: {_first_line(e)}") from None
        except psycopg.Error as e:
            raise StoreError(f"fleet store {self.name}: {_first_line(e)}") from None

    def fetch(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            cur = self.conn.execute(sql, params)
            return [c.name for c in cur.description or ()], cur.fetchall()
        except psycopg.OperationalError as e:
            raise StoreUnreachable(f"fleet store {self.name}: {_first_line(e)}") from None
        except psycopg.Error as e:
            raise StoreError(f"fleet store {self.name}: {_first_line(e)}") from None

    def lock(self, scope: str, keys: Iterable[str] = ("",), *, shared: bool = False) -> None:
        """Inside a transaction: take the advisory locks of ``keys`` in ``scope`` until it ends, in key order
        (scopes in the order of :data:`_LOCK_ORDER`; ``shared``: a shared lock, which only an exclusive one of
        the same key waits for)."""
        assert scope in (*_LOCK_ORDER, "schema"), scope
        ids = sorted({lock_key(scope, k) for k in keys})
        if not ids:
            return
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        self.conn.raw.execute(
            f"SELECT count({fn}(k)) FROM (SELECT k FROM unnest(CAST(%s AS bigint[])) AS u(k) ORDER BY k) AS s", (ids,)
        )

    def refresh_statistics(self) -> None:
        """After a merge: ``ANALYZE`` the store's tables that changed by a tenth since their statistics (a store
        loaded by merges grows faster than autovacuum looks, and a planner that takes ``results`` for an empty
        table reads it whole for every merge)."""
        stale = [
            r[0]
            for r in self.conn.raw.execute(
                "SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema() AND "
                "n_mod_since_analyze > GREATEST(1000, n_live_tup / 10)"
            ).fetchall()
        ]
        for table in stale:
            self.conn.raw.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))

    def analyze(self, temp_table: str) -> None:
        self.conn.raw.execute(f"ANALYZE pg_temp.{temp_table}")  # the store's own name, never input

    def vacuum(self) -> None:
        try:
            self.conn.raw.execute("VACUUM (ANALYZE)")
        except psycopg.Error as e:
            raise StoreError(f"fleet store {self.name}: {_first_line(e)}") from None

    def close(self) -> None:
        try:
            self.conn.raw.close()
        except psycopg.Error:
            pass
