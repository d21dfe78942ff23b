"""Writing to a fleet store on a server, with a local SQLite store as the spool while the server cannot be reached.

Scan nodes and training jobs write to the server directly (:class:`SpooledStore`). When it cannot be reached, drops
the connection or does not answer within the timeout (:class:`~sdcguard.errors.StoreUnreachable`), the write goes
to the spool instead, the logger says so once, and so does every later write of this process (the server is not
waited for again). ``sdcguard forward``, the next scan and the next write that finds the server back send the spool
to it with the merge (:meth:`~.maintenance.StoreMaintenance.merge_from`), by its watermarks: nothing lost, nothing
twice, however outages, scans, prunes of the server and forwards interleave.

Nothing twice even when the server's fate of the failed write is unknown (the connection dropped during
``COMMIT``): every row the spool gets has the natural key the server copy would have. An incident, a checkpoint or a
scrub keeps its uuid. A scan that loses the server half-way is begun again in the spool under its uuid and every
batch it had is replayed there in one (:class:`_ScanLog` keeps each case's passing executions folded and each
failure and retest in order, so the spool's rows have the same ``seq`` as the server's): the merge then upserts the
server's partial rows by ``(scan uuid, seq)`` to the spool's. A spool is never pruned (:meth:`~.store.Store.prune`
refuses it): it holds only what an outage kept from the server, and its row ids never go back.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ...devices import hostname
from ...entry import is_server_url
from ...errors import StoreError, StoreUnreachable
from ...logs import get_logger
from ...records import CaseResult, DeviceInfo, Incident, ScanStatus
from .rows import MergeStats, Tally
from .sqlite.files import check_merge_input
from .store import Store

__all__ = [
    "SpooledStore",
    "SpoolTraining",
    "open_writer",
    "default_spool",
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


def default_spool() -> Path:
    """``$SDCGUARD_SPOOL``, else ``~/.local/state/sdcguard/spool-<host>.db`` (per host: a home directory may be
    shared by many nodes)."""
    named = os.environ.get(SPOOL_ENV)
    if named:
        return Path(named)
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "sdcguard" / f"spool-{hostname()}.db"


def open_writer(
    db: str | os.PathLike[str], *, spool: str | os.PathLike[str] | None = None, timeout_s: float = WRITE_TIMEOUT_S
) -> Store | SpooledStore:
    """The store a scan or a training job writes to: the SQLite file itself, or for a server URL a
    :class:`SpooledStore` with ``spool`` (default :func:`default_spool`)."""
    if not is_server_url(db):
        return Store.open(db)
    return SpooledStore(str(db), Path(spool) if spool is not None else default_spool(), timeout_s=timeout_s)


def forward(url: str, spool: str | os.PathLike[str], *, timeout_s: float = WRITE_TIMEOUT_S) -> MergeStats | None:
    """Send the spool to the server (a merge by the watermarks); None when there is no spool. Raises
    :class:`~sdcguard.errors.StoreUnreachable` while the server cannot be reached."""
    path = Path(spool)
    if not path.exists():
        return None
    check_merge_input(path)
    with Store.open(url, timeout_s=timeout_s) as server:
        return server.merge_from(path)


def forward_spool(db: str | os.PathLike[str], spool: str | os.PathLike[str] | None = None) -> MergeStats | None:
    """For a server store, send ``spool`` (default :func:`default_spool`) if there is one; None when there is none
    or the server cannot be reached (said once through the logger)."""
    if not is_server_url(db):
        return None
    return SpooledStore(str(db), Path(spool) if spool is not None else default_spool()).forward()


class SpoolTraining:
    """``store.training``'s writes (:class:`~.training.Training`) for a server store with a spool: each fixes the
    row's natural key (and its time) once, so both places get the same row and a write whose fate on the server is
    unknown (the connection dropped during ``COMMIT``) is never recorded twice.

    Args:
        writer: the :class:`SpooledStore` that says where a write goes.
    """

    def __init__(self, writer: SpooledStore) -> None:
        self._writer = writer

    def record_incident(self, incident: Incident, *, uuid: str | None = None) -> None:
        """As :meth:`~.training.Training.record_incident`."""
        key = uuid or _uuid.uuid4().hex
        self._writer.either(lambda store: store.training.record_incident(incident, uuid=key))

    def record_checkpoint(self, **row: Any) -> None:
        """As :meth:`~.training.Training.record_checkpoint`."""
        fixed = {"now": time.time(), **row, "uuid": _uuid.uuid4().hex}
        self._writer.either(lambda store: store.training.record_checkpoint(**fixed))

    def record_scrub(self, **row: Any) -> None:
        """As :meth:`~.training.Training.record_scrub`."""
        fixed = {"now": time.time(), **row, "uuid": _uuid.uuid4().hex}
        self._writer.either(lambda store: store.training.record_scrub(**fixed))


@dataclass
class _ScanLog:
    """One scan as the server was told it, folded as the store folds it, to begin it again in the spool."""

    uuid: str
    begin: dict[str, Any]
    entries: list[Any] = field(default_factory=list)
    """In ``seq`` order: ``(case, family)`` (the scan's row of that case's passing first attempts) or a
    :class:`CaseResult` (a failed execution or a retest)."""
    passes: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    """``(case, family) -> [first result, executions, seconds, first start, last start]``."""
    later: list[dict[str, Any]] = field(default_factory=list)
    """The ``meta``, ``finish``, ``finished_at`` and ``total`` of each batch, in order."""
    sid: int = 0
    in_spool: bool = False

    def add(self, results: Sequence[CaseResult], **later: Any) -> None:
        batch: dict[tuple[str, str], list[Any]] = {}
        for r in results:
            if not (r.passed and r.attempt == 0):
                self.entries.append(r)
                continue
            key = (r.case, r.family)
            last = r.last_started_at if r.last_started_at is not None else r.started_at
            if key not in self.passes and key not in batch:
                self.entries.append(key)
            b = batch.get(key)
            if b is None:
                batch[key] = [r, r.executions, r.duration_s, r.started_at, last]
            else:  # the sums in the order the store makes them: within a batch, then batch by batch
                b[1] += r.executions
                b[2] += r.duration_s
                b[3], b[4] = min(b[3], r.started_at), max(b[4], last)
        for key, (r, n, secs, first, last) in batch.items():
            p = self.passes.get(key)
            if p is None:
                self.passes[key] = [r, n, secs, first, last]
            else:
                p[1], p[2], p[3], p[4] = p[1] + n, p[2] + secs, min(p[3], first), max(p[4], last)
        if any(v is not None for v in later.values()):
            self.later.append(later)

    def replay(self) -> list[CaseResult]:
        """The scan's results so far as one batch that the store writes as the rows the server has."""
        out = []
        for e in self.entries:
            if isinstance(e, CaseResult):
                out.append(e)
                continue
            r, n, secs, first, last = self.passes[e]
            out.append(
                dataclasses.replace(
                    r, executions=n, duration_s=secs, started_at=first, last_started_at=None if last == first else last
                )
            )
        return out


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
        self._scans: dict[int, _ScanLog] = {}
        self.spooled = 0
        """Writes this process sent to the spool."""
        self.training = SpoolTraining(self)
        """Incidents, checkpoints and scrubs, on the server or in the spool (:class:`SpoolTraining`)."""

    # ------------------------------------------------------------------ where a write goes
    def _server_store(self) -> Store | None:
        if self._server is None and _down.get(self.url, 0.0) <= time.monotonic():
            try:
                self._server = Store.open(self.url, timeout_s=self.timeout_s, answer_within_s=self.timeout_s)
            except StoreUnreachable as e:
                self._lost(e)
        return self._server

    def _lost(self, e: StoreUnreachable) -> None:
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
            self._spool = Store.open(self.spool_path)
            self._spool.mark_spool(self.url)
        self.spooled += 1
        return self._spool

    def either(self, write: Callable[[Store], T]) -> T:
        """``write`` on the server store, or on the spool when the server cannot take it."""
        server = self._server_store()
        if server is not None:
            try:
                return write(server)
            except StoreUnreachable as e:
                self._lost(e)
        return write(self.spool())

    def _either(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.either(lambda store: getattr(store, name)(*args, **kwargs))

    # ------------------------------------------------------------------ what a scan reads
    def tallies(self, **kwargs: Any) -> list[Tally]:
        """As :meth:`~.store.Store.tallies`, from the server (from the spool while it cannot be reached: this
        node's history there, which is what a scan orders its cases by)."""
        return list(self._either("tallies", **kwargs))

    # ------------------------------------------------------------------ the writes
    def upsert_device(self, info: DeviceInfo, *, now: float | None = None) -> None:
        self._either("upsert_devices", [info], now=time.time() if now is None else now)

    def upsert_devices(self, infos: Sequence[DeviceInfo], *, now: float | None = None) -> None:
        self._either("upsert_devices", infos, now=time.time() if now is None else now)

    def reap(self, **kwargs: Any) -> int:
        return int(self._either("reap", **kwargs))

    def begin_scan(
        self,
        *,
        device: str,
        host: str,
        budget_s: float | None,
        meta: dict[str, Any] | None = None,
        started_at: float | None = None,
    ) -> int:
        """As :meth:`~.store.Store.begin_scan`; the id is this object's (the scan may move to the spool)."""
        begin: dict[str, Any] = dict(
            device=device, host=host, budget_s=budget_s, meta=meta, started_at=started_at or time.time()
        )
        log = _ScanLog(uuid=_uuid.uuid4().hex, begin=begin)
        handle = len(self._scans) + 1
        self._scans[handle] = log
        server = self._server_store()
        if server is not None:
            try:
                log.sid = server.begin_scan(**begin, uuid=log.uuid)
                return handle
            except StoreUnreachable as e:
                self._lost(e)
        self._to_spool(log)
        return handle

    def record_results(
        self,
        scan_id: int,
        results: Sequence[CaseResult],
        *,
        finish: ScanStatus | None = None,
        finished_at: float | None = None,
        total: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """As :meth:`~.store.Store.record_results`, to wherever the scan is."""
        log = self._scans[scan_id]
        if finish is not None and finished_at is None:
            finished_at = time.time()  # one end time, should the scan be replayed in the spool
        later: dict[str, Any] = dict(
            finish=finish, finished_at=finished_at, total=total, meta=dict(meta) if meta else None
        )
        log.add(results, **later)
        if not log.in_spool:
            server = self._server_store()
            if server is not None:
                try:
                    server.record_results(log.sid, results, **later)
                    return
                except StoreUnreachable as e:
                    self._lost(e)
            self._to_spool(log, replay=True)
            return
        self.spool().record_results(log.sid, results, **later)

    def finish_scan(self, scan_id: int, status: ScanStatus, *, finished_at: float | None = None) -> None:
        self.record_results(scan_id, (), finish=status, finished_at=finished_at)

    def _to_spool(self, log: _ScanLog, *, replay: bool = False) -> None:
        """Begin the scan in the spool under its uuid; with ``replay``, with everything it had so far."""
        spool = self.spool()
        log.sid = spool.begin_scan(**log.begin, uuid=log.uuid)
        log.in_spool = True
        if replay:
            spool.record_results(log.sid, log.replay())
            for later in log.later:
                spool.record_results(log.sid, (), **later)

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
            self._lost(e)
        except StoreError as e:  # e.g. a writer role may not roll up scans older than the server's retention
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
