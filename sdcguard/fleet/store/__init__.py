"""The fleet store, which alone holds SQL: :mod:`.schema` (tables, indexes, migrations), :mod:`.connection` (opening
a SQLite file with care, transactions), :mod:`.postgres` (the same store on a PostgreSQL server), :mod:`.store`
(the :class:`~.store.Store` API and its writes), :mod:`.queries` and :mod:`.case_queries` (named reads),
:mod:`.maintenance` (merge, prune, tallies), :mod:`.spool` (a server store's writers and their local spool) and
:mod:`.rows` (what reads return)."""

from .store import QuarantineEntry, Store, default_actor

__all__ = ["Store", "QuarantineEntry", "default_actor"]
