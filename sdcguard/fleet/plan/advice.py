"""A job's plan from its allocation: the checkpoint interval (Young, Daly, and with in-memory recovery), the check
cadence that meets its targets, and the goodput to expect, as a pure function of what the store said
(:class:`~.allocation.Allocation`) and the job's own figures (:class:`PlanSettings`). docs/plan.md has the model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...durations import DAY_S
from ...errors import BadInput
from .allocation import Allocation
from .cadence import Cadence, choose_cadence
from .intervals import RecoveryCost, daly, goodput, goodput_with_recovery, young

__all__ = ["PlanSettings", "Plan", "make_plan"]

HOUR = 3600.0


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    step_s: float
    checkpoint_s: float
    restart_s: float = 600.0
    """From an interruption to training again: the launcher's restart and the checkpoint's reload."""
    recovery_s: float = 30.0
    """From an SDC verdict to the next step under in-memory recovery (docs/recovery.md measures it)."""
    mtbf_s: float | None = None
    """The allocation's mean time between loud interruptions (crashes, hangs, the network), which the store does not
    know; None: none priced."""
    max_unverified_steps: int = 49
    max_overhead: float = 0.05

    def __post_init__(self) -> None:
        for option, v in (("--step-time", self.step_s), ("--checkpoint-cost", self.checkpoint_s)):
            if not (math.isfinite(v) and v > 0):
                raise BadInput(f"{option} must be a positive duration, got {v!r}")
        for option, v in (("--restart-cost", self.restart_s), ("--recovery-cost", self.recovery_s)):
            if not (math.isfinite(v) and v >= 0):
                raise BadInput(f"{option} must be a duration >= 0, got {v!r}")
        if self.mtbf_s is not None and not (math.isfinite(self.mtbf_s) and self.mtbf_s > 0):
            raise BadInput("--mtbf must be a positive duration")


@dataclass(frozen=True, kw_only=True)
class Plan:
    devices: int
    sdc_per_day: float
    sdc_range_per_day: tuple[float, float]
    loud_per_day: float
    mtbf_s: float
    """Mean time between the interruptions that send a job without recovery to its checkpoint (SDC and loud)."""
    young_s: float
    daly_s: float
    recover_interval_s: float | None
    """Daly's interval when SDC is recovered in memory (only loud interruptions restart); None: none priced."""
    cadence: Cadence
    cadence_note: str | None
    lost_per_sdc_s: float
    goodput_restart: float
    goodput_recover: float
    warnings: tuple[str, ...]


def make_plan(allocation: Allocation, settings: PlanSettings) -> Plan:
    s = settings
    sdc = allocation.per_hour / HOUR
    low, high = allocation.bounds_per_hour
    loud = 0.0 if s.mtbf_s is None else 1.0 / s.mtbf_s
    total = sdc + loud
    mtbf = math.inf if total <= 0 else 1.0 / total
    chosen, note = choose_cadence(max_unverified_steps=s.max_unverified_steps, max_overhead=s.max_overhead)
    if math.isfinite(mtbf):
        young_s, daly_s = young(s.checkpoint_s, mtbf), daly(s.checkpoint_s, mtbf)
    else:
        young_s = daly_s = math.inf
    recover_interval = None if s.mtbf_s is None else daly(s.checkpoint_s, s.mtbf_s)
    # Under recovery a sticky SDC costs the steps since the last verified sample: the detection latency and on
    # average half a sampling period, times the step time, plus the recovery itself.
    lost = (chosen.sticky_mean_steps + chosen.replay_every / 2) * s.step_s
    interval = daly_s if math.isfinite(daly_s) else 30 * DAY_S
    g_restart = goodput(interval, s.checkpoint_s, s.restart_s, mtbf) / (1 + chosen.overhead)
    g_recover = goodput_with_recovery(
        recover_interval or interval,
        s.checkpoint_s,
        s.restart_s,
        loud_per_s=loud,
        recoverable_per_s=sdc,
        cost=RecoveryCost(lost_s=lost, recovery_s=s.recovery_s),
    ) / (1 + chosen.overhead)
    warnings = []
    for state in ("quarantined", "probation", "suspect"):
        held = [d.device for d in allocation.devices if d.status == state]
        if held:
            warnings.append(f"{len(held)} device(s) of this allocation are {state}: {', '.join(held[:5])}")
    for d in allocation.devices:
        if not d.known:
            warnings.append(
                f"{d.device}: never tested here, priced at the fleet's rate" + (f"{d.near}" and f" ({d.near})")
            )
    if s.mtbf_s is None:
        warnings.append("no loud interruption priced (crashes, hangs): give the allocation's --mtbf")
    return Plan(
        devices=len(allocation.devices),
        sdc_per_day=sdc * DAY_S,
        sdc_range_per_day=(low * 24.0, high * 24.0),
        loud_per_day=loud * DAY_S,
        mtbf_s=mtbf,
        young_s=young_s,
        daly_s=daly_s,
        recover_interval_s=recover_interval,
        cadence=chosen,
        cadence_note=note,
        lost_per_sdc_s=lost + s.recovery_s,
        goodput_restart=g_restart,
        goodput_recover=g_recover,
        warnings=tuple(warnings),
    )
