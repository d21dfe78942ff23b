"""From what each check saw on one step to the chance that a fault is detected within N steps, for a schedule.

Every detector is a set of :class:`Component` checks. A check runs on the steps its schedule says (every step,
one step in ``period``: the sampled steps, the weight checks, Megatron's weight hash) and reports ``delay`` steps
later (a dedicated shadow's verdict arrives after the step). What it does on a step was measured in the campaign:

- ``hit``: it fires on a step the fault hit (measured on the faulty step ``s``);
- ``state``: it fires on a later step because of what the fault left behind (measured on ``s + 1`` with the fault
  gone: diverged or NaN weights...), and then on every later scheduled step;
- ``persistent``: a hit it sees stays visible on every later scheduled step (replicas that diverged stay apart);
- ``later``: on a later step the fault hits again, the chance it fires (sticky: ``hit``, the same wrong bits every
  time; intermittent: the share of that fault cell's steps on which it fired; one-off: 0).

A fault starts at a step ``s0`` whose position in the schedule is uniform (every phase of ``lcm(period)`` equally
likely). Detection at offset ``k`` (``k + 1`` steps counting the faulty one) happens when some check fires then;
on later hits checks fire independently. :func:`curves` returns, averaged over the phase, the chance of no
detection within ``n`` steps and the chance of a correctly attributed first detection within ``n`` steps, for
every ``n`` up to the horizon: the exact consequence of the schedule and the measured per-step behaviour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Component", "curves", "within", "quantile_steps"]


@dataclass(frozen=True)
class Component:
    period: int = 1
    delay: int = 0
    hit: bool = False
    state: bool = False
    persistent: bool = False
    later: float = 0.0
    hit_attributed: bool = True
    """Whether a firing on the faulty step (or a persistent repeat of it) names exactly the faulty rank."""
    state_attributed: bool = True
    later_attributed: float = 1.0
    """Share of later-hit firings that name exactly the faulty rank."""

    def __post_init__(self) -> None:
        if self.period < 1 or self.delay < 0 or not 0.0 <= self.later <= 1.0:
            raise ValueError(f"bad component {self}")


def _phases(
    components: tuple[Component, ...], horizon: int, phase: int | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Phase weights and, per component, ``sched[e, j]``: whether it checks at offset ``j`` under phase ``e``.

    Small periods: every phase of their lcm. One period longer than the horizon (with every other period 1): only
    the offset of its first check matters, uniform over the period (offsets past the horizon lumped together)."""
    periods = {c.period for c in components}
    big = [p for p in periods if p > horizon]
    j = np.arange(horizon)
    if big and (len(big) > 1 or periods - {1, big[0]}):
        raise ValueError("one period longer than the horizon is supported, with every other period 1")
    if big and phase is not None:
        raise ValueError("a fixed phase is supported for periods within the horizon only")
    if big:
        K = big[0]
        e = np.arange(horizon + 1)  # e < horizon: first check at offset e; e == horizon: none within the horizon
        weights = np.where(e < horizon, 1.0 / K, (K - horizon) / K)
        scheds = [np.ones((e.size, horizon), bool) if c.period == 1 else (j[None, :] == e[:, None]) for c in components]
        return weights, scheds
    L = math.lcm(*periods) if periods else 1
    phi = np.arange(L) if phase is None else np.array([phase % L])
    weights = np.full(phi.size, 1.0 / phi.size)
    return weights, [((phi[:, None] + j[None, :]) % c.period == 0) for c in components]


def curves(
    components: tuple[Component, ...], timing: str, horizon: int, *, phase: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(missed, attributed)``: ``missed[n]`` the chance of no detection within ``n`` steps, ``attributed[n]`` the
    chance that the first detection came within ``n`` steps and named exactly the faulty rank (``n = 0..horizon``;
    "within ``n`` steps" counts the faulty step as the first). Averaged over the phase, or at ``phase``: the fault
    starts at a step ``s0`` with ``s0 % period == phase % period`` for every period."""
    if timing not in ("one-off", "intermittent", "sticky"):
        raise ValueError(f"unknown timing {timing!r}")
    weights, scheds = _phases(components, horizon, phase)
    E = weights.size
    no_fire = np.ones((E, horizon))
    det_any = np.zeros((E, horizon), bool)
    det_bad = np.zeros((E, horizon), bool)
    prob_attr_num = np.zeros((E, horizon))
    prob_sum = np.zeros((E, horizon))
    for c, sched in zip(components, scheds):
        at = np.zeros((E, horizon), bool)  # the check ran at offset j, reported at j + delay
        if c.delay < horizon:
            at[:, c.delay :] = sched[:, : horizon - c.delay]
        first = np.zeros(horizon, bool)
        if c.delay < horizon:
            first[c.delay] = True
        det_first = at & first[None, :] & c.hit
        later_steps = at & ~first[None, :]
        det_later = later_steps & (c.state or (c.hit and c.persistent) or (timing == "sticky" and c.hit))
        det = det_first | det_later
        right = (det_first & c.hit_attributed) | (
            det_later & ((c.state and c.state_attributed) or (not c.state and c.hit_attributed))
        )
        det_any |= det
        det_bad |= det & ~right
        if timing == "intermittent" and c.later > 0:
            p = np.where(later_steps & ~det, c.later, 0.0)
            no_fire *= 1.0 - p
            prob_attr_num += p * c.later_attributed
            prob_sum += p
    p_fire = np.where(det_any, 1.0, 1.0 - no_fire)
    attr = np.where(
        det_any,
        (~det_bad).astype(float),
        np.divide(prob_attr_num, prob_sum, out=np.zeros_like(prob_sum), where=prob_sum > 0),
    )
    survive = np.cumprod(np.concatenate([np.ones((E, 1)), 1.0 - p_fire], axis=1), axis=1)  # (E, horizon + 1)
    first_at = survive[:, :-1] * p_fire
    attributed = np.concatenate([np.zeros((E, 1)), np.cumsum(first_at * attr, axis=1)], axis=1)
    return weights @ survive, weights @ attributed


def within(missed: np.ndarray, n: int) -> float:
    """The chance of detection within ``n`` steps."""
    return float(min(1.0, max(0.0, 1.0 - missed[min(n, missed.size - 1)])))


def quantile_steps(missed_curves: list[np.ndarray], q: float, horizon: int) -> int | None:
    """The ``q`` quantile of the steps to detection (1 = the faulty step) over faults detected within the horizon,
    pooled over faults (equal weight each), or None when none is."""
    pmf = sum(-np.diff(m[: horizon + 1]) for m in missed_curves)
    total = float(np.sum(pmf))
    if total <= 1e-12:
        return None
    cdf = np.cumsum(pmf) / total
    return int(np.searchsorted(cdf, q - 1e-9) + 1)
