"""How often a job should replay and checksum-check its steps: what each setting buys (the chance a fault is caught,
the steps from its onset to its detection) and costs (a share of the step time), from the detection campaign and the
measured costs (docs/detection.md, docs/costs.md; docs/plan.md derives the model).

The model, per fault kind, for a data-parallel job with peer replay every ``replay_every`` (R) steps and the matmul
checksums every ``checksum_every`` (K) steps (0: off):

- after the gradient reduction (reduced gradients, a collective's result): the every-step check sees it on its step;
- a sticky compute fault (a broken unit, every step from its onset): the next sampled step replays it on another
  device; if it sits in a matmul, the next checked step sees it too, whichever comes first (onsets uniform over the
  sampling period, the two schedules independent);
- a one-off compute fault: seen only on its own step, by replay on a sampled step (1/R) or, in a matmul, by the
  checksums on a checked step;
- a weight corrupted in memory: the weight check, every ``weight_check_every`` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import BadInput

__all__ = ["CampaignFigures", "CAMPAIGN", "Cadence", "cadence", "choose_cadence"]


@dataclass(frozen=True, kw_only=True)
class CampaignFigures:
    """The measured inputs of the model (docs/detection.md and docs/costs.md give each with its run and date)."""

    every_step: float = 0.011
    """The every-step checks' share of a step (replay and checksums off)."""
    per_replay: float = 1.15
    """One sampled step's replay, as a share of a step (peer replay on every step: +115% step time)."""
    per_checked_step: float = 0.163
    """One checksum-checked step's extra, as a share of a step."""
    matmul_share: float = 1 / 6
    """The share of compute faults in matmuls (the campaign's mix: one op family of six)."""
    checksum_catch: float = 0.8
    """The share of matmul faults a checked step catches (20 of 25 one-off matmul faults; low mantissa bits fall
    under the rounding bound)."""


CAMPAIGN = CampaignFigures()


@dataclass(frozen=True, kw_only=True)
class Cadence:
    """One setting and what it buys and costs."""

    replay_every: int
    checksum_every: int
    weight_check_every: int
    overhead: float
    """The share of step time the checks add."""
    one_off_caught: float
    """The chance a one-off compute fault is caught (on its own step, or never)."""
    sticky_mean_steps: float
    """Expected steps from a sticky compute fault's onset to its detection (0: on its first step)."""
    sticky_worst_steps: int
    """At most this many steps (the longest a faulty device can go unsampled)."""
    weight_mean_steps: float
    """Expected steps from a weight corrupted in memory to the weight check that sees it."""


def _uniform_min_mean(r: int, k: int) -> float:
    """E[min(U_r, U_k)] for independent uniforms on {0..r-1} and {0..k-1}: the sum over t >= 1 of
    P(U_r >= t) P(U_k >= t)."""
    return sum((r - t) / r * (k - t) / k for t in range(1, min(r, k)))


def cadence(
    replay_every: int, checksum_every: int, weight_check_every: int = 100, figures: CampaignFigures = CAMPAIGN
) -> Cadence:
    """What ``replay_every`` (>= 1) and ``checksum_every`` (0: off) buy and cost (see the module docstring)."""
    for name, v, least in (("replay_every", replay_every, 1), ("checksum_every", checksum_every, 0)):
        if not isinstance(v, int) or v < least:
            raise BadInput(f"{name} must be an integer >= {least}, got {v!r}")
    r, k = replay_every, checksum_every
    overhead = figures.every_step + figures.per_replay / r + (figures.per_checked_step / k if k else 0.0)
    matmul = figures.matmul_share * figures.checksum_catch
    one_off = 1 / r + (1 - 1 / r) * (matmul / k if k else 0.0)
    plain = (r - 1) / 2
    sticky = plain if not k else matmul * _uniform_min_mean(r, k) + (1 - matmul) * plain
    return Cadence(
        replay_every=r,
        checksum_every=k,
        weight_check_every=weight_check_every,
        overhead=overhead,
        one_off_caught=one_off,
        sticky_mean_steps=sticky,
        sticky_worst_steps=r - 1,
        weight_mean_steps=(weight_check_every - 1) / 2 if weight_check_every else float("inf"),
    )


def choose_cadence(
    *, max_unverified_steps: int, max_overhead: float, figures: CampaignFigures = CAMPAIGN
) -> tuple[Cadence, str | None]:
    """The cheapest replay period that leaves no more than ``max_unverified_steps`` steps between verified samples,
    then the most frequent checksums the remaining ``max_overhead`` (a share of step time) pays for. Returns the
    setting and, when the overhead cannot be met at that period, why (the period is kept: a bound on the work a
    sticky fault can corrupt unseen is the stronger promise)."""
    if not isinstance(max_unverified_steps, int) or max_unverified_steps < 1:
        raise BadInput(f"--max-unverified-steps must be an integer >= 1, got {max_unverified_steps!r}")
    if not 0 < max_overhead < 10:
        raise BadInput(f"--max-overhead must be a share of step time in (0, 10), e.g. 0.05, got {max_overhead!r}")
    r = max_unverified_steps + 1  # a sampled step every r steps: at most r - 1 steps in between
    base = cadence(r, 0, figures=figures)
    if base.overhead > max_overhead:
        why = (
            f"replaying one step in {r} costs {base.overhead:.1%} of a step, over --max-overhead {max_overhead:.1%}: "
            "raise --max-unverified-steps, or --max-overhead"
        )
        return base, why
    room = max_overhead - base.overhead
    k = 0
    if room > 0:
        k = max(1, math.ceil(figures.per_checked_step / room))
        while figures.per_checked_step / k > room:  # the division's rounding
            k += 1
    return cadence(r, k, figures=figures), None
