"""SIGTERM and SIGINT in the scanner: preemption (Slurm, Kubernetes), the runner giving up on a worker, or Ctrl-C.

Neither the runner nor a worker lets either signal cut work in half: each installs its own handler for the two
with :func:`on_stop_signals` (the runner forwards the signal to its workers; a worker finishes the case in flight
and records its scan as ``interrupted``), and the previous handlers come back when the work is done.

A child process starts with Python's own SIGINT handler (``KeyboardInterrupt`` wherever it is, a traceback) until
its code installs the scanner's, so a Ctrl-C in its first moments would kill it half-way. The runner therefore
starts workers and a worker its retests inside :func:`shielded`: the two signals are blocked while the child is
made, the child inherits the blocked mask, and a signal sent meanwhile waits, pending, until the child calls
:func:`receive_stop_signals` with its handler in place (a retest never does: it is short and bounded by the
worker's budget, and the worker that waits for it stops after it).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["STOP_SIGNALS", "on_stop_signals", "shielded", "receive_stop_signals"]

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


@contextmanager
def shielded() -> Iterator[None]:
    """Within the block, the stop signals are blocked in this thread: a process started here inherits them blocked
    (see the module docstring). Signals this process gets meanwhile reach its handler when the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def receive_stop_signals() -> None:
    """In a child started :func:`shielded`, once its handler is installed: let the stop signals in (one sent while
    they were blocked arrives now)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
