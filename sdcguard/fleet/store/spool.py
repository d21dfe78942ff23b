"""Writing to a fleet store on a server, with a local SQLite store as the spool while the server cannot be reached.

Scan nodes and training jobs write to the server directly (:class:`SpooledStore`). When it cannot be reached, drops
the connection or does not answer within the timeout (:class:`~sdcguard.errors.StoreUnreachable`), the write goes
to the spool instead, the logger says so once, and so does every later write of this process (the server is not
waited for again). ``sdcguard forward``, the next scan and the next write that finds the server back send the spool
to it with the merge (:meth:`~.maintenance.Maintenance.merge`), by its watermarks: nothing lost, nothing
twice, however outages, scans, prunes of the server and forwards interleave.

Nothing twice even when the server's fate of the failed write is unknown (the connection dropped during ``COMMIT``):
every row the spool gets has the natural key the server copy would have. An incident, a checkpoint or a scrub keeps its
uuid. A scan that loses the server half-way is begun again in the spool under its uuid and every batch it had is
replayed there in one (:class:`~.spool_jobs.SpoolScans` keeps each case's passing executions folded and each failure and
retest in order, so the spool's rows have the same ``seq`` as the server's): the merge then upserts the server's partial
rows by ``(scan uuid, seq)`` to the spool's. A spool is never pruned (:meth:`~.store.Store.prune` refuses it): it holds
only what an outage kept from the server, and its row ids never go back.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ...devices import hostname
from ...entry import is_server_url
from ...errors import BadInput, StoreError, StoreUnreachable
from ...logs import get_logger
from .drills import drill_running, drills_writer, store_in_use
from .rows import MergeStats
from .spool_jobs import SpoolCounts, SpoolScans, SpoolTraining
from .sqlite.files import check_merge_input
from .store import Store

__all__ = [
    "SpooledStore",
    "open_writer",
    "open_reader",
    "default_spool",
    "spools_here",
    "legacy_spool",
    "spool_owner",
    "SpoolOfAnotherServer",
    "forward",
    "forward_spool",
    "SPOOL_ENV",
    "WRITE_TIMEOUT_S",
    "RETRY_AFTER_S",
]

SPOOL_ENV = "SDCGUARD_SPOOL"
"""The environment variable naming the spool of a server store."""
WRITE_TIMEOUT_S = 10.0
"""How long a writer waits for the server (to connect, and for each statement) before it spools."""
RETRY_AFTER_S = 60.0
"""After losing the server, how long a process writes to the spool without trying the server again."""
_down: dict[str, float] = {}
"""Server URL -> when (monotonic) this process tries it again: a writer waits out a timeout once, not per write."""
_warned: set[str] = set()
_log = get_logger("store")
T = TypeVar("T")


def default_spool(url: str) -> Path:
    """``$SDCGUARD_SPOOL``, else ``~/.local/state/sdcguard/spool-<host>-<server>.db``: per host (a home directory
    may be shared by many nodes) and per server (``<server>``: 12 hex digits of the URL's SHA-256), so two stores
    written from one host never share a spool."""
    named = os.environ.get(SPOOL_ENV)
    if named:
        return Path(named)
    return _spool_dir() / f"spool-{hostname()}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.db"


def spools_here() -> list[Path]:
    """This host's spools: ``$SDCGUARD_SPOOL`` where set, else every ``spool-<host>-*.db`` in the spool folder."""
    named = os.environ.get(SPOOL_ENV)
    if named:
        return [Path(named)] if Path(named).exists() else []
    return sorted(_spool_dir().glob(f"spool-{hostname()}-*.db"))


def legacy_spool() -> Path:
    """Where spools were kept before their path named the server (one per host, whatever the server)."""
    return _spool_dir() / f"spool-{hostname()}.db"


def _spool_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "sdcguard"


class SpoolOfAnotherServer(StoreError):
    """A spool holds the writes of another server than the one it was to be sent to or written for."""

    def __init__(self, spool: Path, owner: str, url: str) -> None:
        super().__init__(
            f"the spool {spool} holds writes for {owner}, not {url}: nothing sent, the spool kept; send it to its own "
            f"server with `sdcguard --db '{owner}' forward --spool {spool}`, or give this store its own spool "
            f"(${SPOOL_ENV})"
        )
        self.owner = owner


def spool_owner(spool: Path) -> str | None:
    """The server store ``spool`` was written for (None: no spool there, or a store that is no spool)."""
    if not spool.exists():
        return None
    check_merge_input(spool)
    with Store.open(spool, readonly=True) as s:
        return s.maintenance.spool_for


def open_reader(db: str | os.PathLike[str]) -> Store:
    """The store a training job reads its own records from, read-only: ``db``, or in a drill its drill store
    (:func:`~.drills.store_in_use`), where the drill's writes went."""
    return Store.open(store_in_use(db), readonly=True)


def open_writer(
    db: str | os.PathLike[str], *, spool: str | os.PathLike[str] | None = None, timeout_s: float = WRITE_TIMEOUT_S
) -> Store | SpooledStore:
    """The store a scan or a training job writes to: the SQLite file itself, or for a server URL a
    :class:`SpooledStore` with ``spool`` (default :func:`default_spool`). In a drill (:func:`~.drills.drill_running`)
    the drill store beside ``db``, never ``db``."""
    if drill_running():
        return drills_writer(db)
    if not is_server_url(db):
        return Store.open(db)
    return SpooledStore(str(db), Path(spool) if spool is not None else default_spool(str(db)), timeout_s=timeout_s)


def forward(url: str, spool: str | os.PathLike[str], *, timeout_s: float = WRITE_TIMEOUT_S) -> MergeStats | None:
    """Send the spool to the server (a merge by the watermarks); None when there is no spool. Raises
    :class:`~sdcguard.errors.StoreUnreachable` while the server cannot be reached, :class:`SpoolOfAnotherServer`
    (nothing sent) when the spool was written for another server, :class:`~sdcguard.errors.BadInput` when the file
    is a store but no spool (``sdcguard merge`` takes those)."""
    path = Path(spool)
    if not path.exists():
        return None
    owner = spool_owner(path)
    if owner is None:
        raise BadInput(f"{path} is a fleet store but no spool: `sdcguard merge` folds a node's store into another")
    if owner != url:
        raise SpoolOfAnotherServer(path, owner, url)
    began = time.time()
    with Store.open(path, readonly=True) as sent:
        high = sent.maintenance.high_water()
    with Store.open(url, timeout_s=timeout_s) as server:
        stats = server.maintenance.merge(path)
    try:  # its backlog starts again (sdcguard export spool); a spool this user may only read stays as it was
        with Store.open(path) as sent:
            sent.maintenance.mark_forwarded(began, high)
    except StoreError as e:
        _log.warning("forwarded %s, but could not record it there (its backlog still counts it): %s", path, e)
    return stats


def forward_spool(db: str | os.PathLike[str], spool: str | os.PathLike[str] | None = None) -> MergeStats | None:
    """For a server store, send ``spool`` (default :func:`default_spool`) if there is one; None when there is none
    or the server cannot be reached (said once through the logger)."""
    if not is_server_url(db):
        return None
    if spool is None and SPOOL_ENV not in os.environ and spool_owner(legacy_spool()) == str(db):
        SpooledStore(str(db), legacy_spool()).forward()  # a spool from before its path named the server
    return SpooledStore(str(db), Path(spool) if spool is not None else default_spool(str(db))).forward()


class SpooledStore:
    """The writes of a scan node or a training job to a server store (see the module docstring). One per process
    or thread, like :class:`~.store.Store`; use as a context manager or call :meth:`close`.

    Args:
        url: the server's ``postgresql://`` URL.
        spool: the local SQLite store that holds what the server could not take.
        timeout_s: how long to wait for the server, to connect and for each statement, before spooling.
        retry_after_s: after losing the server, how long this process writes to the spool without trying it.
    """

    def __init__(
        self, url: str, spool: Path, *, timeout_s: float = WRITE_TIMEOUT_S, retry_after_s: float = RETRY_AFTER_S
    ) -> None:
        self.url, self.spool_path, self.timeout_s, self.retry_after_s = url, spool, timeout_s, retry_after_s
        self._server: Store | None = None
        self._spool: Store | None = None
        self.spooled = 0
        """Writes this process sent to the spool."""
        self.scans = SpoolScans(self)
        """Devices and scans, on the server or in the spool (:class:`~.spool_jobs.SpoolScans`)."""
        self.counts = SpoolCounts(self)
        """What a scan reads of its device's history (:class:`~.spool_jobs.SpoolCounts`)."""
        self.training = SpoolTraining(self)
        """Incidents, checkpoints and scrubs, on the server or in the spool (:class:`~.spool_jobs.SpoolTraining`)."""

    # ------------------------------------------------------------------ where a write goes
    def server(self) -> Store | None:
        """The server store, connected when first needed; None while it cannot be reached (after losing it, for
        ``retry_after_s``)."""
        if self._server is None and _down.get(self.url, 0.0) <= time.monotonic():
            try:
                self._server = Store.open(self.url, timeout_s=self.timeout_s, answer_within_s=self.timeout_s)
            except StoreUnreachable as e:
                self.lost(e)
        return self._server

    def lost(self, e: StoreUnreachable) -> None:
        """The server was lost (``e`` says how): write to the spool from now on, and say so once."""
        _down[self.url] = time.monotonic() + self.retry_after_s
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.url not in _warned:
            _warned.add(self.url)
            _log.warning(
                "%s; writing to the spool %s until it is back (`sdcguard forward`, or the next scan, sends it)",
                e,
                self.spool_path,
            )

    def spool(self) -> Store:
        """The spool, opened (and created) when first needed."""
        if self._spool is None:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            spool = Store.open(self.spool_path)
            owner = spool.maintenance.spool_for
            if owner is not None and owner != self.url:  # never mix two servers' writes in one spool
                spool.close()
                raise SpoolOfAnotherServer(self.spool_path, owner, self.url)
            spool.maintenance.mark_spool(self.url)
            self._spool = spool
        self.spooled += 1
        return self._spool

    def either(self, write: Callable[[Store], T]) -> T:
        """``write`` on the server store, or on the spool when the server cannot take it."""
        server = self.server()
        if server is not None:
            try:
                return write(server)
            except StoreUnreachable as e:
                self.lost(e)
        return write(self.spool())

    # ------------------------------------------------------------------ the end
    def forward(self) -> MergeStats | None:
        """Send the spool to the server now (None: no spool, the server still cannot be reached, or it refused
        the forward: said through the logger, the spool stays for `sdcguard forward`). Never raises a store
        error: a scan or a job must not fail over its bookkeeping."""
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        try:
            return forward(self.url, self.spool_path, timeout_s=self.timeout_s)
        except StoreUnreachable as e:
            self.lost(e)
        except (StoreError, BadInput) as e:  # another server's spool; a writer role may not roll up old scans
            _log.warning("could not forward the spool %s to %s: %s", self.spool_path, self.url, e)
        return None

    def close(self) -> None:
        """Close both stores; a spool written by this process is forwarded when the server is back."""
        if self.spooled and _down.get(self.url, 0.0) <= time.monotonic():
            self.forward()
        for store in (self._server, self._spool):
            if store is not None:
                store.close()
        self._server = self._spool = None

    def __enter__(self) -> SpooledStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
