"""Recording one device's scan in the fleet store, so that a scanner killed at any moment leaves it consistent.

``store.scans.begin`` creates the scan as ``running``; results go in batches (every :data:`BATCH` results or
:data:`FLUSH_EVERY_S` seconds), each batch one transaction, and the store folds each case's passing first
attempts into the scan's one row for that case (failures and retests stay one row each). The last batch, the
final status and ``total`` (every execution the scanner produced, retests included) land in one transaction
(``store.scans.record(..., finish=status, total=...)``). A scanner killed mid-way therefore leaves a ``running`` scan
holding the batches it committed, never a ``complete`` scan with missing results: a complete scan's rows always
add up to its ``total``, and the next scan of that device (which holds the device's lock, so nobody else is
scanning it) marks such leftovers ``interrupted``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sdcguard.records import CaseResult, ScanStatus

__all__ = ["ScanRecorder", "BATCH", "FLUSH_EVERY_S"]

BATCH = 256
"""Results per transaction: large enough that recording costs little next to the cases themselves."""
FLUSH_EVERY_S = 2.0
"""A batch is flushed at least this often, so a killed scan loses at most this much work."""


class ScanRecorder:
    """Buffers one scan's results and writes them in atomic batches."""

    def __init__(
        self,
        store: Any,
        scan_id: int,
        *,
        batch: int = BATCH,
        flush_every_s: float = FLUSH_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.scan_id = scan_id
        self.batch = batch
        self.flush_every_s = flush_every_s
        self._clock = clock
        self._pending: list[CaseResult] = []
        self._last_flush = clock()
        self.recorded = 0
        """Results written so far (committed)."""
        self.seq = 0
        """Results handed to the recorder so far."""
        self.slowest_flush_s = 0.0
        self.finished: ScanStatus | None = None

    def add(self, result: CaseResult) -> None:
        self._pending.append(result)
        self.seq += 1
        if len(self._pending) >= self.batch or self._clock() - self._last_flush >= self.flush_every_s:
            self.flush()

    def extend(self, results: Sequence[CaseResult]) -> None:
        for r in results:
            self.add(r)

    def flush(self, *, finish: ScanStatus | None = None, meta: Mapping[str, Any] | None = None) -> None:
        if self.finished is not None:
            raise RuntimeError(f"scan {self.scan_id} already finished as {self.finished}")
        if finish is None and not self._pending:
            return
        t0 = self._clock()
        self.store.scans.record(
            self.scan_id, self._pending, finish=finish, total=self.seq if finish is not None else None, meta=meta
        )
        self.slowest_flush_s = max(self.slowest_flush_s, self._clock() - t0)
        self.recorded += len(self._pending)
        self._pending = []
        self._last_flush = self._clock()
        if finish is not None:
            self.finished = finish

    def finish(self, status: ScanStatus, *, meta: Mapping[str, Any] | None = None) -> None:
        """The remaining results, the final status, the scan's total and ``meta`` (merged into the scan's), in
        one transaction."""
        self.flush(finish=status, meta=meta)
