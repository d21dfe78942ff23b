"""Recording one device's scan in the fleet store, so that a scanner killed at any moment leaves it consistent.

``begin_scan`` creates the scan as ``running``; results go in batches (every :data:`BATCH` results or
:data:`FLUSH_EVERY_S` seconds), each batch one transaction; the last batch and the final status land in one
transaction (``record_results(..., finish=status)``). A scanner killed mid-way therefore leaves a ``running`` scan
holding a prefix of its results, never a ``complete`` scan with missing ones; the next scan of that device (which
holds the device's lock, so nobody else is scanning it) marks such leftovers ``interrupted``.

The store numbers a scan's results (``seq``) in order. The recorder always keeps the latest result back for the
final transaction, and that last result carries ``detail["scan_total"]``, the number of results the scan
produced: a ``complete`` scan whose result count differs from its last result's ``scan_total`` would be a scan
with missing results, and anyone can check there is none.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
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
        if len(self._pending) > self.batch or self._clock() - self._last_flush >= self.flush_every_s:
            self.flush()

    def extend(self, results: Sequence[CaseResult]) -> None:
        for r in results:
            self.add(r)

    def flush(self, *, finish: ScanStatus | None = None) -> None:
        if self.finished is not None:
            raise RuntimeError(f"scan {self.scan_id} already finished as {self.finished}")
        if finish is None:
            # keep the latest result back: the final transaction always carries one (with the scan's total)
            batch, keep = self._pending[:-1], self._pending[-1:]
            if not batch:
                return
        else:
            batch, keep = self._pending, []
            if batch:
                last = batch[-1]
                batch[-1] = dataclasses.replace(last, detail={**last.detail, "scan_total": self.seq})
        t0 = self._clock()
        self.store.record_results(self.scan_id, batch, finish=finish)
        self.slowest_flush_s = max(self.slowest_flush_s, self._clock() - t0)
        self.recorded += len(batch)
        self._pending = keep
        self._last_flush = self._clock()
        if finish is not None:
            self.finished = finish

    def finish(self, status: ScanStatus) -> None:
        """The remaining results and the final status, in one transaction."""
        self.flush(finish=status)
