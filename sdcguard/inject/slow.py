"""The slow-device fire drill: make a device take longer for the same work by burning cycles, never by sleeping.

A sleeping thread costs no CPU time and a sleeping GPU no kernel time, so a drill that slept would not look like a
throttled device to a scanner that times what the device did. :func:`burn_cpu` spins on the calling thread until
its CPU time has grown by the requested amount; the numpy backend calls it inside its timed region with
``(factor - 1)`` times the case's own CPU time, so the case takes ``factor`` times as long on that core.
"""

from __future__ import annotations

import time

__all__ = ["burn_cpu", "slow_factor"]


def burn_cpu(seconds: float) -> None:
    """Keep the calling thread busy until it has used ``seconds`` more CPU time (its own, not wall time)."""
    if seconds <= 0:
        return
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):  # some arithmetic between clock reads
            x = (x * 1103515245 + i) & 0xFFFFFFFF


def slow_factor(hook: object, case_id: str) -> float:
    """How many times as long ``case_id`` must take under ``hook`` (an output hook; 1.0 for none or no slow rule)."""
    factor = getattr(hook, "slowdown", None)
    return float(factor(case_id)) if callable(factor) else 1.0
