"""Make a thread take longer for the same work by burning its CPU time, never by sleeping: the slow fire drills.

A sleeping thread costs no CPU time and a sleeping GPU no kernel time, so a drill that slept would not look like a
throttled device to a scanner that times what the device did. :func:`slow_down` makes the thread do the same work
again (into spare buffers, its output discarded) as many whole times as fit in ``factor`` times the work's time,
then :func:`burn_cpu` spins for the rest. Redoing the same work keeps the caches as the work left them: a spin loop
alone would also evict them, and short cases would then read several times slower than asked. Users: the golden
numpy backend, inside its timed region, when its output hook asks for a slowdown (the scanner's ``slow`` drill,
:mod:`sdcguard.inject.spec`); the training drill's :class:`~sdcguard.inject.torch_slow.SlowOpsMode`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["burn_cpu", "slow_down"]


def burn_cpu(seconds: float) -> None:
    """Keep the calling thread busy until it has used ``seconds`` more CPU time (its own, not wall time)."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(10):  # a little arithmetic between clock reads (each read is a system call)
            x = (x * 1103515245 + i) & 0xFFFFFFFF


def slow_down(again: Callable[[], object], *, started: float, factor: float) -> None:
    """Stretch a computation that began at thread CPU time ``started`` (and just ended) to ``factor`` times its
    CPU time: ``again()`` (the same work) while a whole run fits, then a spin for the remainder."""
    took = time.thread_time() - started
    target = started + factor * took
    while time.thread_time() + took <= target:
        again()
    burn_cpu(target - time.thread_time())
