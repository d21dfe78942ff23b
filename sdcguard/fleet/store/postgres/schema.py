"""The fleet store's schema on PostgreSQL: the same tables, columns, keys and indexes as SQLite's, derived from them.

A PostgreSQL store begins at :data:`BASE_VERSION`: its tables are those a SQLite store has after every migration
up to that version (:data:`~..schema.MIGRATIONS`), read from SQLite's own catalogue and spelled for PostgreSQL by
:func:`~.dialect.to_postgres` (``INTEGER`` is ``BIGINT``, ``REAL`` is ``DOUBLE PRECISION``, a table's ``id INTEGER
PRIMARY KEY`` an identity column), so the two schemas cannot drift apart. A later version adds its step to both
:data:`~..schema.MIGRATIONS` and :data:`MIGRATIONS` (the tests hold that every version past the base has both, and
that both backends then have the same columns).

Two functions make the store's one SQL text work here (:mod:`.dialect`): ``total(x)``, SQLite's ``TOTAL`` (a
float sum, 0.0 over no rows; parallel-safe, so the report's big aggregations may use parallel workers), and
:data:`JSON_EACH`, the keys and values of a JSON array or object as text. The schema version and the mark that
this is an sdcguard store live in ``meta`` (``schema_version``, ``application``).
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from psycopg import sql as pgsql

from ..schema import migrate
from ..tallies import DAY_INDEXES, migrate_report_summaries
from .dialect import to_postgres

__all__ = ["BASE_VERSION", "MIGRATIONS", "JSON_EACH", "APPLICATION", "tables_ddl", "create", "upgrade"]

BASE_VERSION = 10
"""The schema version a new PostgreSQL store starts at (SQLite's migrations up to it are history)."""
APPLICATION = "sdcguard"
"""``meta.application`` of every PostgreSQL store: a database whose ``meta`` lacks it is not one."""
JSON_EACH = "sdcguard_json_each"

_FUNCTIONS = (
    "CREATE OR REPLACE AGGREGATE total(double precision) (SFUNC = float8pl, STYPE = double precision, "
    "COMBINEFUNC = float8pl, INITCOND = '0', PARALLEL = SAFE)",
    f"CREATE OR REPLACE FUNCTION {JSON_EACH}(doc text) RETURNS TABLE(key text, value text) LANGUAGE sql "
    "IMMUTABLE PARALLEL SAFE AS $$ "
    "SELECT CAST(o - 1 AS text), v FROM json_array_elements_text(CASE WHEN json_typeof(CAST(doc AS json)) = "
    "'array' THEN CAST(doc AS json) ELSE CAST('[]' AS json) END) WITH ORDINALITY AS a(v, o) "
    "UNION ALL SELECT k, v FROM json_each_text(CASE WHEN json_typeof(CAST(doc AS json)) = 'object' "
    "THEN CAST(doc AS json) ELSE CAST('{}' AS json) END) AS e(k, v) $$",
)


def _v11(conn: Any) -> None:
    """A scrub's ``unverified`` outcome and the items it names. SQLite rebuilds the table for its CHECK; here the
    constraint is replaced and the column added in place (the rows, their ids and the roles' grants stay; the new
    column comes last, where SQLite's is after ``bad``: the store names every column it writes and reads)."""
    conn.raw.execute(
        "ALTER TABLE checkpoint_scrubs DROP CONSTRAINT IF EXISTS checkpoint_scrubs_status_check, "
        "ADD CONSTRAINT checkpoint_scrubs_status_check "
        "CHECK (status IN ('clean','corrupt','unreadable','unverified')), "
        "ADD COLUMN IF NOT EXISTS unverified TEXT NOT NULL DEFAULT '[]'"
    )


_TABLE_RIGHTS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


def _v12(conn: Any) -> None:
    """The family tallies and ``scans_counted``, as on SQLite (:func:`~..tallies.migrate_report_summaries`: the
    same SQL text), and the day-led indexes a server's merge joins read (:data:`~..tallies.DAY_INDEXES`); the
    roles granted on the day tallies get the same rights on the two new tables (a writer's scans write them), so
    an upgrade needs no second ``db grant``."""
    migrate_report_summaries(conn)
    for statement in DAY_INDEXES:
        conn.execute(statement)
    grants = conn.raw.execute(
        "SELECT grantee, privilege_type FROM information_schema.role_table_grants WHERE table_schema = "
        "current_schema() AND table_name = 'day_tallies' AND grantee <> current_user"
    ).fetchall()
    for grantee, privilege in grants:
        for table in ("family_tallies", "family_totals"):
            if privilege not in _TABLE_RIGHTS or (privilege == "DELETE" and table == "family_totals"):
                continue  # (a writer deletes running totals by day, never a key's totals)
            conn.raw.execute(
                pgsql.SQL("GRANT {} ON {} TO {}").format(
                    pgsql.SQL(privilege), pgsql.Identifier(table), pgsql.Identifier(grantee)
                )
            )


def _v13(conn: Any) -> None:
    """Each device's version (:data:`~..schema.MIGRATIONS` 13): a column with a constant default, added without
    rewriting the table."""
    conn.raw.execute("ALTER TABLE devices ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0")


MIGRATIONS: dict[int, Callable[[Any], None]] = {11: _v11, 12: _v12, 13: _v13}
"""``version -> function`` bringing a PostgreSQL store from ``version - 1`` to ``version`` (past
:data:`BASE_VERSION`), run in one transaction; the same change as :data:`~..schema.MIGRATIONS` of that version."""


@functools.cache
def tables_ddl() -> tuple[str, ...]:
    """Every ``CREATE TABLE`` and ``CREATE INDEX`` of a SQLite store at :data:`BASE_VERSION`, for PostgreSQL."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("BEGIN")
        migrate(conn, 0, upto=BASE_VERSION)
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid").fetchall()
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    out = []
    for (sql,) in rows:
        text = to_postgres(sql).replace("%%", "%")
        text = re.sub(r"\bid BIGINT PRIMARY KEY\b", "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", text)
        out.append(text)
    return tuple(out)


def create(conn: Any, *, store_id: str, created_by: str) -> None:
    """Create every table, index and function of a new store (inside the caller's transaction)."""
    for statement in (*_FUNCTIONS, *tables_ddl()):
        conn.raw.execute(statement)
    conn.raw.execute(
        "INSERT INTO meta(key, value) VALUES ('application', %s), ('schema_version', %s), ('store_id', %s), "
        "('created_by', %s)",
        (APPLICATION, str(BASE_VERSION), store_id, created_by),
    )
    upgrade(conn, BASE_VERSION)


def upgrade(conn: Any, current: int) -> None:
    """Apply every migration after ``current`` inside the caller's transaction, then stamp the version."""
    from ..schema import SCHEMA_VERSION

    for version in range(current + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version](conn)
    for statement in _FUNCTIONS:  # CREATE OR REPLACE: a newer sdcguard may have changed one
        conn.raw.execute(statement)
    conn.raw.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
