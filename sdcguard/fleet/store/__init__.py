"""The fleet store, which alone holds SQL: :class:`~.store.Store` and its jobs (:mod:`.scans`, :mod:`.failures`,
:mod:`.counts`, :mod:`.quarantine`, :mod:`.training`, :mod:`.summaries`, :mod:`.maintenance`, :mod:`.diagnostics`)
over :mod:`.core`; the backends (:mod:`.sqlite`, :mod:`.postgres`), every migration (:mod:`.schema`), the SQL a
write runs in its transaction (:mod:`.writes`), a server store's writers and their spool (:mod:`.spool`) and what
reads return (:mod:`.rows`)."""

from .store import Store

__all__ = ["Store"]
