"""The fleet store, which alone holds SQL: :class:`~.store.Store`, its jobs (:mod:`.scans`, :mod:`.failures`,
:mod:`.counts`, :mod:`.training`, :mod:`.summaries`, and the parts of :mod:`.queries` and :mod:`.maintenance`) over
:mod:`.core`; the backends (:mod:`.sqlite`, :mod:`.postgres`), the migrations (:mod:`.schema`), the SQL a write runs
in its transaction (:mod:`.writes`), a server store's writers and their spool (:mod:`.spool`) and what reads return
(:mod:`.rows`)."""

from .store import Store

__all__ = ["Store"]
