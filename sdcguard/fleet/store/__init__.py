"""The fleet store, which alone holds SQL: :mod:`.schema` (tables, indexes, migrations), :mod:`.connection` (opening
a file with care, transactions), :mod:`.store` (the :class:`~.store.Store` API and its writes), :mod:`.queries` and
:mod:`.case_queries` (named reads), :mod:`.maintenance` (merge, prune, tallies) and :mod:`.rows` (what reads
return)."""

from .store import QuarantineEntry, Store, default_actor

__all__ = ["Store", "QuarantineEntry", "default_actor"]
