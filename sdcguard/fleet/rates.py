"""Per-device SDC rates with one-sided Clopper–Pearson bounds, computed by SQL aggregation.

A device's *rate* is failed executions / executions of golden cases (first attempts only, see
:mod:`sdcguard.fleet.store.store`). ``rate_low`` and ``rate_high`` are one-sided bounds, each at ``confidence``:
``P(true rate >= rate_low) >= C`` and ``P(true rate <= rate_high) >= C``.

Why Clopper–Pearson and not Jeffreys: Clopper–Pearson inverts the exact binomial test, so its coverage is at
least the nominal confidence for every true rate and every n (it is conservative). Jeffreys has better *average*
coverage but dips below nominal for rates near 0, which is exactly where SDC rates live. The lower bound drives
quarantine (taking hardware out of service): a bound that is never optimistic means a healthy device is
quarantined by chance at most ``1 - C`` of the time. With zero failures the upper bound is
``1 - (1 - C) ** (1 / n)``, i.e. ``n = ln(1 - C) / ln(1 - R)`` clean executions bound the rate by R
(299 clean executions: rate_high <= 1% at 95%).

The bounds are quantiles of the beta distribution, computed with ``scipy.special.betaincinv`` (exactly what
``scipy.stats.beta.ppf`` calls, without importing all of ``scipy.stats``: the report CLI starts faster).

The counts come from :meth:`sdcguard.fleet.store.counts.Counts.tallies` (grouped in SQL over a covering index and two
small partial ones); this module is only the statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import betaincinv

from .store.rows import Tally

if TYPE_CHECKING:
    from .store.store import Store

__all__ = ["Rate", "DeviceRates", "clopper_pearson", "clopper_pearson_arrays", "device_rates", "fleet_rates"]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def clopper_pearson_arrays(
    failures: np.ndarray | Sequence[int], executions: np.ndarray | Sequence[int], confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`clopper_pearson`: arrays of one-sided lower and upper bounds."""
    _check_confidence(confidence)
    k = np.asarray(failures, dtype=np.float64)
    n = np.asarray(executions, dtype=np.float64)
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("need 0 <= failures <= executions")
    alpha = 1.0 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(k > 0, betaincinv(np.maximum(k, 1), np.maximum(n - k + 1, 1), alpha), 0.0)
        high = np.where(k < n, betaincinv(k + 1, np.maximum(n - k, 1), confidence), 1.0)
    low = np.where(n > 0, low, 0.0)
    high = np.where(n > 0, high, 1.0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def clopper_pearson(failures: int, executions: int, confidence: float = 0.95) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds ``(rate_low, rate_high)`` of a binomial rate, each at ``confidence``.

    ``executions == 0`` gives ``(0, 1)``: nothing is known.
    """
    low, high = clopper_pearson_arrays([failures], [executions], confidence)
    return float(low[0]), float(high[0])


@dataclass(kw_only=True, slots=True)
class Rate:
    """Executions, failures and the SDC rate with its bounds, for one device (and family) or the fleet.

    A value: treat it as read-only. (Not ``frozen``: a 10,000-device report builds ~70,000 of them, and frozen
    dataclasses are several times slower to construct.)
    """

    executions: int
    failures: int
    rate: float
    rate_low: float
    rate_high: float
    test_hours: float
    """Device-hours of testing: the summed ``duration_s`` of every execution (retests included) / 3600."""

    @property
    def failures_per_test_hour(self) -> float | None:
        """Failures per device-hour (GPU-hour) of testing; None before any testing time."""
        return self.failures / self.test_hours if self.test_hours > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "executions": self.executions,
            "failures": self.failures,
            "rate": self.rate,
            "rate_low": self.rate_low,
            "rate_high": self.rate_high,
            "test_hours": self.test_hours,
            "failures_per_test_hour": self.failures_per_test_hour,
        }


@dataclass(kw_only=True, slots=True)
class DeviceRates:
    """A device's overall rate and its rate per kernel family. A value: treat it as read-only (not ``frozen``, as
    :class:`Rate`: a report builds one per device)."""

    device: str
    overall: Rate
    families: dict[str, Rate] = field(default_factory=dict)


def _rates(k: np.ndarray, n: np.ndarray, seconds: np.ndarray, confidence: float) -> list[Rate]:
    low, high = clopper_pearson_arrays(k, n, confidence)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n > 0, k / np.maximum(n, 1), 0.0)
    hours = seconds / 3600.0
    return [
        Rate(executions=ni, failures=ki, rate=ri, rate_low=lo, rate_high=hi, test_hours=h)
        for ni, ki, ri, lo, hi, h in zip(
            n.tolist(), k.tolist(), rate.tolist(), low.tolist(), high.tolist(), hours.tolist()
        )
    ]


def _from_tallies(tallies: Sequence[Tally], confidence: float) -> list[Rate]:
    n = np.array([t.executions for t in tallies], dtype=np.int64)
    k = np.array([t.failures for t in tallies], dtype=np.int64)
    s = np.array([t.test_s for t in tallies], dtype=np.float64)
    return _rates(k, n, s, confidence)


def device_rates(
    store: Store,
    *,
    since: float | None = None,
    devices: Sequence[str] | None = None,
    confidence: float = 0.95,
    by_family: bool = True,
) -> dict[str, DeviceRates]:
    """Rates of every device with executions since ``since`` (or ever), overall and (``by_family``) per kernel
    family; without ``by_family`` the store groups by device only and ``families`` stays empty."""
    _check_confidence(confidence)
    if not by_family:
        tallies = store.counts.tallies(since=since, devices=devices, by="device")
        return {
            str(t.device): DeviceRates(device=str(t.device), overall=r)
            for t, r in zip(tallies, _from_tallies(tallies, confidence))
        }
    tallies = store.counts.tallies(since=since, devices=devices, by="device_family")
    if not tallies:
        return {}
    per_family = _from_tallies(tallies, confidence)
    # Overall per device: the sum of its family rows (rows come ordered by device).
    names = [t.device for t in tallies]
    start = np.array([i for i in range(len(names)) if i == 0 or names[i] != names[i - 1]], dtype=np.int64)
    n = np.array([t.executions for t in tallies], dtype=np.int64)
    k = np.array([t.failures for t in tallies], dtype=np.int64)
    s = np.array([t.test_s for t in tallies], dtype=np.float64)
    overall = _rates(np.add.reduceat(k, start), np.add.reduceat(n, start), np.add.reduceat(s, start), confidence)
    out: dict[str, DeviceRates] = {}
    bounds = [*start.tolist(), len(tallies)]
    for j in range(len(start)):
        lo, hi = bounds[j], bounds[j + 1]
        dev = names[lo]
        assert dev is not None
        out[dev] = DeviceRates(
            device=dev,
            overall=overall[j],
            # tallies by device and family have a family (Tally's fields are optional for other groupings)
            families={tallies[i].family: per_family[i] for i in range(lo, hi)},  # type: ignore[misc]
        )
    return out


def fleet_rates(store: Store, *, since: float | None = None, confidence: float = 0.95) -> DeviceRates:
    """The whole fleet's rate (``device="fleet"``), overall and per kernel family."""
    _check_confidence(confidence)
    tallies = store.counts.tallies(since=since, by="family")
    fam = {t.family: r for t, r in zip(tallies, _from_tallies(tallies, confidence))}
    overall = _rates(
        np.array([sum(t.failures for t in tallies)]),
        np.array([sum(t.executions for t in tallies)]),
        np.array([sum(t.test_s for t in tallies)]),
        confidence,
    )[0]
    # tallies by family have a family (Tally's fields are optional for other groupings)
    return DeviceRates(device="fleet", overall=overall, families=fam)  # type: ignore[arg-type]
