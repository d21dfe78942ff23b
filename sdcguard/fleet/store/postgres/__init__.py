"""The fleet store on a PostgreSQL server: :mod:`.connection` (opening, transactions, advisory locks),
:mod:`.dialect` (the store's one SQL text as PostgreSQL reads it), :mod:`.schema` (the tables, derived from
SQLite's), :mod:`.transfer` (a SQLite merge input copied in) and :mod:`.roles` (least-privilege roles for scan
nodes, jobs and readers). Imported only for a ``postgresql://`` store:
psycopg is an optional dependency (the ``postgres`` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....errors import needs_extra

if TYPE_CHECKING:
    from .connection import PostgresBackend

__all__ = ["open_server"]


def open_server(
    url: str, *, create: bool, timeout_s: float, readonly: bool, answer_within_s: float | None
) -> PostgresBackend:
    """The backend of the store at ``url`` (:meth:`~.connection.PostgresBackend.open`); without psycopg, one line
    naming the extra to install (the light install has none)."""
    try:
        from .connection import PostgresBackend
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("psycopg"):
            raise
        raise needs_extra(f"a fleet store on a PostgreSQL server ({url})", "psycopg", "postgres") from None
    return PostgresBackend.open(
        url, create=create, timeout_s=timeout_s, readonly=readonly, answer_within_s=answer_within_s
    )
