"""SIGTERM and SIGINT in the scanner: preemption (Slurm, Kubernetes), the runner giving up on a worker, or Ctrl-C.

Neither the runner nor a worker lets either signal cut work in half: each installs its own handler for the two
with :func:`on_stop_signals` (the runner forwards the signal to its workers; a worker finishes the case in flight
and records its scan as ``interrupted``), and the previous handlers come back when the work is done.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["STOP_SIGNALS", "on_stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that ask a scan to stop."""


@contextmanager
def on_stop_signals(handler: Callable[[int], None]) -> Iterator[None]:
    """Within the block, ``handler(signum)`` runs for SIGTERM and SIGINT; the previous handlers are restored after."""

    def _handle(signum: int, frame: Any) -> None:
        handler(signum)

    old = {s: signal.signal(s, _handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
