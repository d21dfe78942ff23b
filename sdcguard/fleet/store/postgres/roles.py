"""Least-privilege roles on a PostgreSQL store: what a scan node or a training job may do, and what a reader may.

The store's owner (who created it, and runs migrations, ``prune`` and ``vacuum``) grants; the role itself is made
beforehand by the server's administrator (``CREATE ROLE scanner LOGIN``, its password in the nodes' ``~/.pgpass``
or service file, never in sdcguard's ``--db``). Two kinds:

- ``writer`` (scan nodes, training jobs, their spools' forwards, a node's policy run): ``SELECT``, ``INSERT`` and
  ``UPDATE`` on the store's tables (a scan grows its rows and running totals in place), ``DELETE`` only where a
  writer's own work deletes (a probation's end removes its quarantine row; the running totals drop what nets to
  nothing), the identity sequences, temporary tables (the running totals are computed in them). No ``DELETE`` of
  scans, results, incidents or any history, no ``TRUNCATE``, no DDL: a compromised node can add wrong rows, never
  remove the fleet's record. (Forwarding a spool whose scans are older than the server's retention rolls them up,
  which deletes rows: that forward needs the owner.)
- ``reader`` (reports, dashboards, exports): ``SELECT`` only.

Every statement names identifiers through :mod:`psycopg.sql` (quoted), never by string formatting.
"""

from __future__ import annotations

from typing import Any, Literal

from psycopg import sql

__all__ = ["RoleKind", "ROLE_KINDS", "grant", "WRITER_DELETES"]

RoleKind = Literal["writer", "reader"]
ROLE_KINDS: tuple[RoleKind, ...] = ("writer", "reader")
WRITER_DELETES = ("quarantine", "day_tallies", "case_tallies", "family_tallies")
"""The tables a writer's own work deletes rows of."""


def _statements(role: str, kind: RoleKind, schema: str, database: str) -> list[sql.Composed]:
    r, s = sql.Identifier(role), sql.Identifier(schema)
    out = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r),
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(s, r),
    ]
    if kind == "writer":
        deletes = sql.SQL(", ").join(sql.Identifier(schema, t) for t in WRITER_DELETES)
        out += [
            sql.SQL("GRANT INSERT, UPDATE ON ALL TABLES IN SCHEMA {} TO {}").format(s, r),
            sql.SQL("GRANT DELETE ON {} TO {}").format(deletes, r),
            sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(s, r),
            sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(sql.Identifier(database), r),
        ]
    return out


def grant(conn: Any, role: str, kind: RoleKind, *, run: bool = True) -> list[str]:
    """Grant ``role`` what a ``kind`` needs on the store of ``conn`` (a :class:`~.connection.PgConnection`), in
    the caller's transaction (``run`` False: only say what it would run); returns the statements as SQL text."""
    from ....errors import BadInput

    if kind not in ROLE_KINDS:
        raise BadInput(f"a role is a writer or a reader, not {kind!r}")
    raw = conn.raw
    schema, database, exists = raw.execute(
        "SELECT current_schema(), current_database(), EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)", (role,)
    ).fetchone()
    if not exists and run:
        raise BadInput(
            f"no role {role!r} on this server: its administrator creates it first (CREATE ROLE {role} LOGIN), "
            "with its password in the nodes' ~/.pgpass or service file"
        )
    statements = _statements(role, kind, schema, database)
    if run:
        for statement in statements:
            raw.execute(statement)
    return [statement.as_string(raw) for statement in statements]
