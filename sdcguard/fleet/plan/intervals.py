"""Checkpoint intervals and goodput under exponential failures: Young's and Daly's optimum intervals, and the
expected share of wall time spent on useful work (docs/plan.md has the formulas, their assumptions and limits).

Every time is in seconds. ``checkpoint_s`` (C): the time a checkpoint blocks training; ``restart_s`` (R): from an
interruption to training again (reload included); ``mtbf_s`` (M): the allocation's mean time between the failures
that interrupt it; ``interval_s`` (T): the compute between two checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import BadInput

__all__ = ["young", "daly", "goodput", "RecoveryCost", "goodput_with_recovery"]


def _positive(**values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise BadInput(f"{name} must be a positive number of seconds, got {v!r}")


def young(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: ``sqrt(2 C M)``."""
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006): ``sqrt(2 C M) [1 + sqrt(C / 2M) / 3 + (C / 2M) / 9] - C`` while
    ``C < 2M``, else ``M`` (a checkpoint that costs more than two failure intervals: checkpoint once per failure)."""
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - checkpoint_s


def goodput(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Useful work over wall time, Daly's exact expectation for exponential failures (a failure may strike during
    the work, the checkpoint or the restart; each costs the work since the last checkpoint plus a restart):
    ``T / (M e^(R/M) (e^((T + C)/M) - 1))``. ``mtbf_s`` infinite: ``T / (T + C)``."""
    _positive(interval_s=interval_s, checkpoint_s=checkpoint_s)
    if not (math.isfinite(restart_s) and restart_s >= 0):
        raise BadInput(f"restart_s must be a number of seconds >= 0, got {restart_s!r}")
    if mtbf_s == math.inf:
        return interval_s / (interval_s + checkpoint_s)
    _positive(mtbf_s=mtbf_s)
    try:
        return interval_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + checkpoint_s) / mtbf_s))
    except OverflowError:  # failures hundreds of times as often as an interval completes: nothing gets done
        return 0.0


@dataclass(frozen=True, kw_only=True)
class RecoveryCost:
    """What one SDC event costs a job that recovers in memory (``escalate="recover"``) instead of restarting."""

    lost_s: float
    """The work redone: the steps since the last verified snapshot (detection latency and half a sampling interval
    on average), times the step time."""
    recovery_s: float
    """From the verdict to the next step: roll back, re-form the group, heal, vote."""


def goodput_with_recovery(
    interval_s: float,
    checkpoint_s: float,
    restart_s: float,
    *,
    loud_per_s: float,
    recoverable_per_s: float,
    cost: RecoveryCost,
) -> float:
    """Goodput when recoverable SDC events (``recoverable_per_s``) cost ``cost`` each in place, and every other
    interruption (``loud_per_s``: crashes, hangs, SDC the job cannot recover from) restarts from the checkpoint: the
    restarts' goodput (:func:`goodput` at ``1 / loud_per_s``) times the share of the remaining time the in-place
    recoveries leave (``1 / (1 + rate x cost)``, the events Poisson in the time the job runs)."""
    mtbf = math.inf if loud_per_s <= 0 else 1.0 / loud_per_s
    base = goodput(interval_s, checkpoint_s, restart_s, mtbf)
    return base / (1.0 + recoverable_per_s * (cost.lost_s + cost.recovery_s))
