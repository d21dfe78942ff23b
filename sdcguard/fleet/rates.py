"""Per-device SDC rates with one-sided Clopper–Pearson bounds, computed by SQL aggregation.

A device's *rate* is failed executions / executions of golden cases (first attempts only, see
:mod:`sdcguard.store`). ``rate_low`` and ``rate_high`` are one-sided bounds, each at ``confidence``:
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

The aggregation is one ``GROUP BY device, family`` over a covering index (executions and testing time), plus
two small queries over partial indexes (failures, retests, both rare); Python only sees grouped rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import betaincinv

if TYPE_CHECKING:
    from .store import Store

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
            "executions": self.executions, "failures": self.failures, "rate": self.rate,
            "rate_low": self.rate_low, "rate_high": self.rate_high, "test_hours": self.test_hours,
            "failures_per_test_hour": self.failures_per_test_hour,
        }


@dataclass(frozen=True, kw_only=True)
class DeviceRates:
    """A device's overall rate and its rate per kernel family."""

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


def _grouped(
    store: Store, keys: str, where: str, params: list[Any]
) -> tuple[list[tuple[Any, ...]], np.ndarray, np.ndarray, np.ndarray]:
    """``(key tuples, executions, failures, seconds)`` grouped by ``keys``, first attempts only.

    The big scan counts rows and sums durations over the covering index ``results_rates``; failures and retests
    are rare and come from the partial indexes, so no per-row expression is evaluated over a million rows.
    """
    conn = store._conn
    w = f"WHERE {where}" if where else ""
    a = f"AND {where}" if where else ""
    rows = conn.execute(
        f"SELECT {keys}, TOTAL(executions), TOTAL(duration_s) FROM results {w} GROUP BY {keys} ORDER BY {keys}",
        params,
    ).fetchall()
    width = keys.count(",") + 1
    fail = {
        tuple(r[:width]): r[width]
        for r in conn.execute(
            f"SELECT {keys}, COUNT(*) FROM results INDEXED BY results_failures WHERE passed = 0 AND attempt = 0 {a} "
            f"GROUP BY {keys}", params
        )
    }
    retests = {
        tuple(r[:width]): r[width]
        for r in conn.execute(f"SELECT {keys}, COUNT(*) FROM results INDEXED BY results_retests WHERE attempt > 0 {a} GROUP BY {keys}", params)
    }
    key_list = [tuple(r[:width]) for r in rows]
    # a retest row is always one execution (only passing first attempts are aggregated)
    n = np.array([int(r[width]) - retests.get(key, 0) for r, key in zip(rows, key_list)], dtype=np.int64)
    k = np.array([fail.get(key, 0) for key in key_list], dtype=np.int64)
    s = np.array([r[width + 1] for r in rows], dtype=np.float64)
    return key_list, n, k, s


def device_rates(
    store: Store, *, since: float | None = None, devices: Sequence[str] | None = None, confidence: float = 0.95,
    by_family: bool = True,
) -> dict[str, DeviceRates]:
    """Rates of every device with executions since ``since`` (or ever), overall and (``by_family``) per kernel
    family; without ``by_family`` the query groups by device only and ``families`` stays empty."""
    _check_confidence(confidence)
    clauses: list[str] = []
    params: list[Any] = []
    if devices is not None:
        clauses.append("device IN (SELECT value FROM json_each(?))")
        params.append(json.dumps(list(devices)))
    if since is not None:
        clauses.append("started_at >= ?")
        params.append(since)
    if not by_family:
        keys, n, k, s = _grouped(store, "device", " AND ".join(clauses), params)
        rates = _rates(k, n, s, confidence)
        return {key[0]: DeviceRates(device=key[0], overall=r) for key, r in zip(keys, rates)}
    keys, n, k, s = _grouped(store, "device, family", " AND ".join(clauses), params)
    if not keys:
        return {}
    per_family = _rates(k, n, s, confidence)
    # Overall per device: sum the family rows of each device (rows come ordered by device).
    names = [key[0] for key in keys]
    start = np.array([i for i in range(len(names)) if i == 0 or names[i] != names[i - 1]], dtype=np.int64)
    dn, dk, ds = np.add.reduceat(n, start), np.add.reduceat(k, start), np.add.reduceat(s, start)
    overall = _rates(dk, dn, ds, confidence)
    out: dict[str, DeviceRates] = {}
    bounds = [*start.tolist(), len(keys)]
    for j in range(len(start)):
        lo, hi = bounds[j], bounds[j + 1]
        out[names[lo]] = DeviceRates(
            device=names[lo], overall=overall[j], families={keys[i][1]: per_family[i] for i in range(lo, hi)}
        )
    return out


def fleet_rates(store: Store, *, since: float | None = None, confidence: float = 0.95) -> DeviceRates:
    """The whole fleet's rate (``device="fleet"``), overall and per kernel family."""
    where, params = ("started_at >= ?", [since]) if since is not None else ("", [])
    keys, n, k, s = _grouped(store, "family", where, params)
    fam = dict(zip([key[0] for key in keys], _rates(k, n, s, confidence)))
    overall = _rates(np.array([k.sum()]), np.array([n.sum()]), np.array([s.sum()]), confidence)[0]
    return DeviceRates(device="fleet", overall=overall, families=fam)
