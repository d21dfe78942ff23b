"""Which case runs next, and whether it still fits the budget.

Order: one case of every family before a second case of any family (a 2-second scan still touches the GEMM
units, the ALUs, the IEEE paths and memory), families that failed on this device before first (a suspect device
gets its suspect family re-tested even when the budget is short). The order repeats to fill the budget: every
repetition is one more execution, and executions are what the failure rate is measured against.

Budget: a case starts only when its estimated wall time (the slowest iteration of that case seen so far, plus a
margin) still fits before the deadline, with room left for the final flush to the store. Unknown cases are
assumed to take :data:`UNKNOWN_CASE_S` (the suite's contract: every case well under 0.3 s). When the next case
does not fit, cheaper ones are tried; the scan stops when none fits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

__all__ = ["HasFamily", "order_cases", "next_case", "Budget", "CaseClock", "UNKNOWN_CASE_S"]

UNKNOWN_CASE_S = 0.3
"""Assumed wall time of a case never timed on this device."""
_MARGIN = 1.3
"""Timing noise allowance on top of the slowest observed iteration."""


class HasFamily(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def family(self) -> str: ...


C = TypeVar("C", bound=HasFamily)


def order_cases(cases: Iterable[C], past_failures: Mapping[str, int] | None = None) -> list[C]:
    """One scan cycle: a permutation of ``cases`` interleaving families round-robin.

    Families are ordered by past failures on this device (most first), then by name; within a family the suite's
    order is kept. The first ``k`` entries (``k`` = number of families) hold one case of every family.
    """
    past = past_failures or {}
    by_family: dict[str, list[C]] = {}
    for case in cases:
        by_family.setdefault(case.family, []).append(case)
    families = sorted(by_family, key=lambda f: (-past.get(f, 0), f))
    out: list[C] = []
    depth = 0
    while len(out) < sum(len(v) for v in by_family.values()):
        for family in families:
            members = by_family[family]
            if depth < len(members):
                out.append(members[depth])
        depth += 1
    return out


class CaseClock:
    """Per-case wall-time estimates learned from this scan's iterations."""

    def __init__(self, unknown_s: float = UNKNOWN_CASE_S, margin: float = _MARGIN) -> None:
        self.unknown_s = unknown_s
        self.margin = margin
        self._worst: dict[str, float] = {}

    def estimate(self, case_id: str) -> float:
        worst = self._worst.get(case_id)
        return self.unknown_s if worst is None else worst * self.margin

    def observe(self, case_id: str, seconds: float) -> None:
        self._worst[case_id] = max(seconds, self._worst.get(case_id, 0.0))


class Budget:
    """A deadline ``seconds`` after ``start()``; None means "one pass over the cycle, no time limit"."""

    def __init__(self, seconds: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds is not None and seconds <= 0:
            raise ValueError(f"budget must be > 0 seconds, got {seconds}")
        self.seconds = seconds
        self._clock = clock
        self._start: float | None = None
        self.reserve_s = 0.05
        """Kept free for the final flush (raised to the slowest flush seen)."""

    def start(self) -> None:
        self._start = self._clock()

    def elapsed(self) -> float:
        return 0.0 if self._start is None else self._clock() - self._start

    def remaining(self) -> float:
        if self.seconds is None:
            return float("inf")
        return self.seconds - self.elapsed() - self.reserve_s

    def fits(self, estimate_s: float) -> bool:
        return estimate_s <= self.remaining()

    def observe_flush(self, seconds: float) -> None:
        self.reserve_s = max(self.reserve_s, seconds * _MARGIN)


def next_case(plan: Sequence[C], position: int, budget: Budget, clock: CaseClock) -> tuple[C, int] | None:
    """The next case of the repeating ``plan`` from ``position`` that fits the budget, and the position after it.

    Cases that would overrun are skipped (a cheaper one may still fit); None when no case of the plan fits.
    """
    for step in range(len(plan)):
        i = (position + step) % len(plan)
        if budget.fits(clock.estimate(plan[i].id)):
            return plan[i], i + 1
    return None
