"""The jobs of a writer to a server store with its spool (:class:`~.spool.SpooledStore`): ``.scans``, ``.training``
and what a scan reads of ``.counts``, shaped as the store's own (:class:`~.scans.Scans`,
:class:`~.training.Training`, :class:`~.counts.Counts`), each write going to the server or, while it cannot take
it, to the spool (:class:`Route`), with what a write needs to land once: a row's natural key fixed before the first
attempt, a scan's batches kept to begin it again in the spool (:class:`_ScanLog`). See :mod:`.spool` for when the
spool is used and how it reaches the server."""

from __future__ import annotations

import dataclasses
import time
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ...errors import StoreUnreachable
from ...records import CaseResult, DeviceInfo, Incident, ScanStatus
from .rows import Tally
from .store import Store

__all__ = ["Route", "SpoolCounts", "SpoolScans", "SpoolTraining"]

T = TypeVar("T")


class Route(Protocol):
    """Where a write goes: what :class:`~.spool.SpooledStore` offers its jobs."""

    def server(self) -> Store | None:
        """The server store, None while it cannot be reached."""
        ...

    def spool(self) -> Store:
        """The spool."""
        ...

    def lost(self, e: StoreUnreachable) -> None:
        """The server was lost: write to the spool from now on."""
        ...

    def either(self, write: Callable[[Store], T]) -> T:
        """``write`` on the server store, or on the spool when the server cannot take it."""
        ...


class SpoolCounts:
    """What a scan reads of ``store.counts`` (:class:`~.counts.Counts`) through a writer with a spool.

    Args:
        writer: where a read goes (the :class:`~.spool.SpooledStore`).
    """

    def __init__(self, writer: Route) -> None:
        self._writer = writer

    def tallies(self, **window: Any) -> list[Tally]:
        """As :meth:`~.counts.Counts.tallies`, from the server (from the spool while it cannot be reached: this
        node's history there, which is what a scan orders its cases by)."""
        return self._writer.either(lambda store: store.counts.tallies(**window))


class SpoolTraining:
    """``store.training``'s writes (:class:`~.training.Training`) for a server store with a spool: each fixes the
    row's natural key (and its time) once, so both places get the same row and a write whose fate on the server is
    unknown (the connection dropped during ``COMMIT``) is never recorded twice.

    Args:
        writer: where a write goes (the :class:`~.spool.SpooledStore`).
    """

    def __init__(self, writer: Route) -> None:
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


class SpoolScans:
    """``store.scans``' writes (:class:`~.scans.Scans`) for a server store with a spool. A scan that loses the
    server half-way is begun again in the spool under its uuid with every batch it had (:class:`_ScanLog`).

    Args:
        writer: where a write goes (the :class:`~.spool.SpooledStore`).
    """

    def __init__(self, writer: Route) -> None:
        self._writer = writer
        self._logs: dict[int, _ScanLog] = {}

    def record_devices(self, infos: Sequence[DeviceInfo], *, now: float | None = None) -> None:
        """As :meth:`~.scans.Scans.record_devices` (the time fixed once, for both places)."""
        t = time.time() if now is None else now
        self._writer.either(lambda store: store.scans.record_devices(infos, now=t))

    def reap(self, **where: Any) -> int:
        """As :meth:`~.scans.Scans.reap`, where the device's scans are now (the server, or the spool while it is
        away)."""
        return self._writer.either(lambda store: store.scans.reap(**where))

    def begin(
        self,
        *,
        device: str,
        host: str,
        budget_s: float | None,
        meta: dict[str, Any] | None = None,
        started_at: float | None = None,
    ) -> int:
        """As :meth:`~.scans.Scans.begin`; the id is this object's (the scan may move to the spool)."""
        begin: dict[str, Any] = dict(
            device=device, host=host, budget_s=budget_s, meta=meta, started_at=started_at or time.time()
        )
        log = _ScanLog(uuid=_uuid.uuid4().hex, begin=begin)
        handle = len(self._logs) + 1
        self._logs[handle] = log
        server = self._writer.server()
        if server is not None:
            try:
                log.sid = server.scans.begin(**begin, uuid=log.uuid)
                return handle
            except StoreUnreachable as e:
                self._writer.lost(e)
        self._to_spool(log)
        return handle

    def record(
        self,
        scan_id: int,
        results: Sequence[CaseResult],
        *,
        finish: ScanStatus | None = None,
        finished_at: float | None = None,
        total: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """As :meth:`~.scans.Scans.record`, to wherever the scan is."""
        log = self._logs[scan_id]
        if finish is not None and finished_at is None:
            finished_at = time.time()  # one end time, should the scan be replayed in the spool
        later: dict[str, Any] = dict(
            finish=finish, finished_at=finished_at, total=total, meta=dict(meta) if meta else None
        )
        log.add(results, **later)
        if not log.in_spool:
            server = self._writer.server()
            if server is not None:
                try:
                    server.scans.record(log.sid, results, **later)
                    return
                except StoreUnreachable as e:
                    self._writer.lost(e)
            self._to_spool(log, replay=True)
            return
        self._writer.spool().scans.record(log.sid, results, **later)

    def finish(self, scan_id: int, status: ScanStatus, *, finished_at: float | None = None) -> None:
        """As :meth:`~.scans.Scans.finish`, to wherever the scan is."""
        self.record(scan_id, (), finish=status, finished_at=finished_at)

    def _to_spool(self, log: _ScanLog, *, replay: bool = False) -> None:
        """Begin the scan in the spool under its uuid; with ``replay``, with everything it had so far."""
        spool = self._writer.spool()
        log.sid = spool.scans.begin(**log.begin, uuid=log.uuid)
        log.in_spool = True
        if replay:
            spool.scans.record(log.sid, log.replay())
            for later in log.later:
                spool.scans.record(log.sid, (), **later)
