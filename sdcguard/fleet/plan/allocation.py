"""What the fleet store knows of the devices one job will run on: each device's SDC events per hour of use with
exact bounds, its status, and the fleet's rate as the prior of a device it has never seen (``sdcguard plan``).

A device's rate is its golden-scan failures plus the training incidents naming it, per hour of testing (docs/plan.md
says why and what that assumes), over the window, from its last release on where it was released inside it (a
release ends the evidence before it, as for the policy). Drills are in a store of their own, never here. The bounds
are exact one-sided Poisson bounds on the count in that time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import chi2

from ...devices import parse_device_id, unknown_device
from ...errors import BadInput
from ..rates import device_rates, fleet_rates
from ..store.store import Store

__all__ = ["DeviceRisk", "Allocation", "read_allocation", "poisson_bounds"]


def poisson_bounds(events: int, hours: float, confidence: float) -> tuple[float, float]:
    """One-sided exact bounds, each at ``confidence``, of a Poisson rate per hour seen ``events`` times in
    ``hours`` (0 hours: ``(0, inf)``, nothing is known)."""
    if hours <= 0:
        return 0.0, math.inf
    low = chi2.ppf(1 - confidence, 2 * events) / 2 / hours if events else 0.0
    high = chi2.ppf(confidence, 2 * events + 2) / 2 / hours
    return float(low), float(high)


@dataclass(frozen=True, kw_only=True)
class DeviceRisk:
    """One device of the allocation."""

    device: str
    known: bool
    """Whether the store has tested it; a device it has not gets the fleet's rate (the prior)."""
    events: int
    """Golden-scan failures and training incidents naming it, in its evidence window."""
    hours: float
    """Its hours of testing in that window."""
    per_hour: float
    low_per_hour: float
    high_per_hour: float
    status: str
    """healthy, suspect, quarantined or probation (the policy's, now)."""
    near: str = ""
    """For an unknown device: the closest ids the store knows (a typo?)."""


@dataclass(frozen=True, kw_only=True)
class Allocation:
    devices: tuple[DeviceRisk, ...]
    fleet_per_hour: float
    """The fleet's rate: failures and incidents per test-hour of every device in the window (the prior)."""
    confidence: float

    @property
    def per_hour(self) -> float:
        return sum(d.per_hour for d in self.devices)

    @property
    def bounds_per_hour(self) -> tuple[float, float]:
        """The sum of the devices' bounds: a range at least as wide as ``confidence`` needs (each side's bounds
        hold together with at least that probability only where one device dominates)."""
        return sum(d.low_per_hour for d in self.devices), sum(d.high_per_hour for d in self.devices)

    def lemons(self, limit: int = 5) -> list[DeviceRisk]:
        """The devices whose lower bound is above the fleet's rate (worse than the fleet, with the evidence to say
        so), worst first."""
        worse = [d for d in self.devices if d.known and d.low_per_hour > self.fleet_per_hour]
        return sorted(worse, key=lambda d: -d.per_hour)[:limit]


def read_allocation(store: Store, devices: Sequence[str], *, since: float, confidence: float = 0.95) -> Allocation:
    """The allocation of ``devices`` (well-formed ids, each once) as the store knows them since ``since``."""
    if not devices:
        raise BadInput("the allocation is empty: give its devices (--devices FILE or --hosts LIST)")
    for d in devices:
        parse_device_id(d)  # BadInput for an id that is not well-formed
    if len(set(devices)) != len(devices):
        raise BadInput("the allocation names a device twice")
    releases = store.quarantine.releases()
    starts = {d: max(since, releases.get(d, since)) for d in devices}
    fleet = fleet_rates(store, since=since, confidence=confidence).overall
    incidents = store.training.incidents(since=since)
    fleet_events = fleet.failures + sum(1 for i in incidents if i.device is not None)
    fleet_per_hour = fleet_events / fleet.test_hours if fleet.test_hours > 0 else 0.0
    rates = device_rates(store, since=since, devices=[d for d in devices if starts[d] == since], by_family=False)
    for d in (d for d in devices if starts[d] > since):  # released in the window: its evidence from then on
        rates.update(device_rates(store, since=starts[d], devices=[d], by_family=False))
    named: dict[str, int] = {}
    for i in incidents:
        if i.device is not None and i.device in starts and i.time >= starts[i.device]:
            named[i.device] = named.get(i.device, 0) + 1
    statuses = store.quarantine.statuses(suspect_since=since, devices=list(devices))
    known = [k.id for k in store.scans.devices()]
    out = []
    for d in devices:
        r = rates.get(d)
        hours = r.overall.test_hours if r is not None else 0.0
        status = str(statuses[d]) if d in statuses else "unknown"
        if hours <= 0:
            near = "" if d in known else str(unknown_device(d, known, what="").args[0]).split(";", 1)[-1].strip()
            out.append(
                DeviceRisk(
                    device=d,
                    known=False,
                    events=named.get(d, 0),
                    hours=0.0,
                    per_hour=fleet_per_hour,
                    low_per_hour=fleet_per_hour,
                    high_per_hour=fleet_per_hour,
                    status=status,
                    near=near,
                )
            )
            continue
        events = r.overall.failures + named.get(d, 0) if r is not None else 0
        low, high = poisson_bounds(events, hours, confidence)
        out.append(
            DeviceRisk(
                device=d,
                known=True,
                events=events,
                hours=hours,
                per_hour=events / hours,
                low_per_hour=low,
                high_per_hour=high,
                status=status,
            )
        )
    return Allocation(devices=tuple(out), fleet_per_hour=fleet_per_hour, confidence=confidence)
