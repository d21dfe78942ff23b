"""The fleet store: one SQLite file (WAL) holding devices, scans, results, incidents and quarantine state.

This module holds the writes; :mod:`.queries` the named reads, :mod:`.maintenance` merging and pruning,
:mod:`.connection` opening and transactions, :mod:`.schema` the tables. Nothing outside these modules writes
SQL: everything else asks :class:`Store` by name and gets records (:mod:`.rows`).

The store grows with scans and cases, not with executions: the passing first attempts of one case in one scan
are one row (their count, summed time, first and last start, and output digest), folded together as batches
arrive; every failed execution and every retest is its own row with its bits, element, location and retest
outcome. Counts, rates, bounds and testing time are exactly those of one row per execution.
"""

from __future__ import annotations

import operator

from ...errors import BadInput
from .maintenance import StoreMaintenance
from .queries import StoreQueries

__all__ = ["Store"]

_TERMINAL: frozenset[str] = frozenset({"complete", "preempted", "interrupted", "error"})


_ID = operator.attrgetter("id")
"""Devices' rows are updated in id order, as every other write takes them."""


class Store(StoreQueries, StoreMaintenance):
    """The fleet store. Open with :meth:`Store.open`; use as a context manager or call :meth:`close`.

    One ``Store`` belongs to one thread (SQLite connections are not shared); open one per process or thread.
    """

    # ------------------------------------------------------------------ a server's spool
    def mark_spool(self, server: str) -> None:
        """Mark this (SQLite) store as the spool of the server store ``server`` (its URL, which holds no
        password): :meth:`prune` then refuses it (:mod:`.spool`)."""
        if self.spool_for != server:
            with self._write() as conn:
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('spool_for', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (server,),
                )

    @property
    def spool_for(self) -> str | None:
        """The server store this store is the spool of (None: it is none)."""
        return self._meta("spool_for")

    # ------------------------------------------------------------------ roles (a server store)
    def grant(self, role: str, kind: str = "writer", *, run: bool = True) -> list[str]:
        """Grant the server role ``role`` what a scan node or job (``writer``) or a reader needs on this store
        (:mod:`.postgres.roles`); ``run`` False only says how. Returns the SQL statements."""
        if self.backend != "postgresql":
            raise BadInput(f"{self.path} is a SQLite file: its access is the file's permissions, not roles")
        from .postgres.roles import grant

        with self._write() as conn:
            return grant(conn, role, kind, run=run)  # type: ignore[arg-type]  # checked there

    # ------------------------------------------------------------------ what a policy run decided
