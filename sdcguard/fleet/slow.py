"""Slow devices: the same golden cases, timed on devices of one model, compared robustly.

A degraded device (throttling, a bad fan, a downclocked bus) returns right numbers slowly. The golden suite runs
identical work (the same case, the same inputs) on every device of a model, and the store keeps, per scan and
case, how many passing executions there were and their summed time. The scanner times what the device did (the
thread's CPU time on a pinned core, kernel time on a GPU), not wall time, so preemption on a loaded host is not
slowness.

The rule, a pure function of :class:`~.rows.CaseTiming` records (:func:`judge_slow`):

- a device's time for a case is its mean seconds per passing first execution over the window; cases with fewer
  than ``min_executions`` executions on the device are left out;
- its **slowdown** on a case is that time over the reference: the median of the same case's times on its peers
  (the other devices of the same model, kind and, where no model is known, host); the device's slowdown is the
  median over its cases (per kernel family: over the family's cases), robust to a case that happened to run while
  something else shared the core;
- ``slowdown_low`` is a distribution-free lower confidence bound on that median (the sign test's order statistic
  at ``confidence``), so it needs enough cases (``min_cases``) before it says anything;
- **slow** when ``slowdown_low`` exceeds ``1 + threshold`` (default 20% slower) and, with at least ``min_peers``
  peers, the slowdown also stands ``spread_z`` robust deviations (1.4826 x the median absolute deviation of the
  log slowdowns of the model's devices) above the model's median: a model whose devices naturally vary by 30% flags
  none of them at 20%.

How sure (``confidence``): ``high`` with ``min_peers`` or more peers; with one or two peers (two cores of one
host) the reference is those few devices, so the verdict is ``medium``, ``high`` when the device's own history
agrees (its latest scan is slower than its earlier scans of the window by more than the threshold: the device got
slower, not its peer faster); with no peer at all, only its own history speaks: ``low``, and slow only when its
latest scan's lower bound against its earlier scans exceeds the threshold. Scaling every device's times by the
same factor changes nothing (property-tested), and a device whose every case is within the threshold is never slow.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Literal

from ..records import SLOW_KIND
from .rows import CaseTiming

if TYPE_CHECKING:
    from .store import Store

__all__ = [
    "SlowSettings", "Slowness", "Sureness", "SlowBasis", "judge_slow", "median_lower_bound", "peer_group",
    "fleet_slowness",
]

Sureness = Literal["high", "medium", "low"]
"""How sure a verdict is (see the module docstring)."""
SlowBasis = Literal["peers", "pair", "history", "training", "none"]
"""What the device was compared with: ``min_peers`` or more devices of its model, one or two, only its own earlier
scans, a training job's replays (``slow`` incidents), or nothing."""


@dataclass(frozen=True, kw_only=True)
class SlowSettings:
    """Thresholds of the slowness rule (the policy's ``slow_*`` fields)."""

    threshold: float = 0.2
    """Slow when the lower bound of the slowdown exceeds ``1 + threshold`` (0.2: 20% slower than the peers)."""
    confidence: float = 0.95
    """Confidence of the distribution-free lower bound of the median slowdown."""
    min_executions: int = 3
    """Executions of a case on a device before its time counts."""
    min_cases: int = 5
    """Cases compared before any verdict (the median's bound needs them)."""
    min_peers: int = 3
    """Peers of the same model for a ``peers`` verdict (and the spread rule)."""
    spread_z: float = 3.0
    """With ``min_peers`` peers: the slowdown must also stand this many robust deviations above the model's median."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 10:
            raise ValueError(f"slow threshold must be in (0, 10), got {self.threshold}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"slow confidence must be in [0.5, 1), got {self.confidence}")
        if self.min_executions < 1 or self.min_cases < 1 or self.min_peers < 1 or self.spread_z < 0:
            raise ValueError("min_executions, min_cases and min_peers must be >= 1, spread_z >= 0")


@dataclass(frozen=True, kw_only=True)
class Slowness:
    """One device's slowness verdict."""

    device: str
    slow: bool
    slowdown: float | None = None
    """Median over cases of (the device's time / its peers' median time): 2.0 is twice as slow. None: no peer."""
    slowdown_low: float | None = None
    """Lower confidence bound of ``slowdown`` (None: too few cases)."""
    basis: SlowBasis = "none"
    confidence: Sureness | None = None
    """How sure the verdict is (None when nothing could be compared)."""
    peers: int = 0
    """Devices of the same model it was compared with."""
    cases: int = 0
    """Cases compared."""
    history: float | None = None
    """Its latest scan against its earlier scans in the window (median over cases; None: one scan)."""
    families: dict[str, float] = field(default_factory=dict)
    """Slowdown per kernel family."""
    threshold: float = 0.2
    """The threshold it was judged at."""
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        """The report's ``slow*`` fields."""
        return {"slow": self.slow, "slowdown": _round(self.slowdown), "slowdown_low": _round(self.slowdown_low),
                "slow_basis": self.basis, "slow_confidence": self.confidence}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def median_lower_bound(values: Sequence[float], confidence: float) -> float | None:
    """A one-sided lower confidence bound on the median of ``values`` (distribution-free: the largest order
    statistic ``x_(k)`` with ``P(Binomial(n, 1/2) < k) <= 1 - confidence``); None when ``n`` is too small."""
    xs = sorted(values)
    n = len(xs)
    alpha = 1.0 - confidence
    cdf, k = 0.0, 0
    for j in range(n):  # cdf = P(B <= j - 1) before adding j
        p = math.comb(n, j) / 2.0**n
        if cdf + p > alpha:
            break
        cdf += p
        k = j + 1
    return xs[k - 1] if k >= 1 else None


def _times(timings: Iterable[CaseTiming], settings: SlowSettings,
           ) -> tuple[dict[str, dict[str, float]], dict[str, str], dict[str, dict[int, dict[str, tuple[int, float]]]]]:
    """Per device: ``case -> mean seconds``, ``case -> family``, and per scan ``case -> (executions, seconds)``."""
    total: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    family: dict[str, str] = {}
    scans: dict[str, dict[int, dict[str, tuple[int, float]]]] = defaultdict(lambda: defaultdict(dict))
    for t in timings:
        if t.executions <= 0 or t.seconds <= 0:
            continue
        acc = total[t.device][t.case]
        acc[0] += t.executions
        acc[1] += t.seconds
        family[t.case] = t.family
        n, s = scans[t.device][t.scan].get(t.case, (0, 0.0))
        scans[t.device][t.scan][t.case] = (n + t.executions, s + t.seconds)
    means = {d: {c: s / n for c, (n, s) in cases.items() if n >= settings.min_executions}
             for d, cases in total.items()}
    return means, family, scans


def _history(per_scan: Mapping[int, Mapping[str, tuple[int, float]]], settings: SlowSettings,
             ) -> tuple[float | None, float | None]:
    """The latest scan's slowdown against the device's earlier scans (median, lower bound), None when one scan."""
    if len(per_scan) < 2:
        return None, None
    latest = max(per_scan)
    before: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for scan, cases in per_scan.items():
        if scan != latest:
            for c, (n, s) in cases.items():
                before[c][0] += n
                before[c][1] += s
    logs = [math.log((s / n) / (before[c][1] / before[c][0])) for c, (n, s) in per_scan[latest].items()
            if n >= settings.min_executions and before[c][0] >= settings.min_executions]
    if len(logs) < settings.min_cases:
        return None, None
    low = median_lower_bound(logs, settings.confidence)
    return math.exp(median(logs)), None if low is None else math.exp(low)


def judge_slow(timings: Iterable[CaseTiming], groups: Mapping[str, str],
               settings: SlowSettings | None = None) -> dict[str, Slowness]:
    """The slowness verdict of every device in ``timings`` (see the module docstring).

    ``groups``: device -> its peer group (model, kind and, for an unknown model, host); devices of one group are
    peers. A device missing from ``groups`` is its own group.
    """
    s = settings or SlowSettings()
    means, family, scans = _times(timings, s)
    members: dict[str, list[str]] = defaultdict(list)
    for d in sorted(means):
        members[groups.get(d, d)].append(d)
    limit = math.log1p(s.threshold)
    out: dict[str, Slowness] = {}
    for devices in members.values():
        many = len(devices) - 1 >= s.min_peers
        # Many peers: one reference per case for the whole model (the device itself is one vote among many);
        # few: the median of the others.
        shared = _reference(devices, means) if many else None
        logs_of: dict[str, dict[str, float]] = {}
        for d in devices:
            ref = shared if shared is not None else _reference([p for p in devices if p != d], means)
            logs_of[d] = {c: math.log(t / ref[c]) for c, t in means[d].items() if c in ref}
        level = {d: median(v.values()) for d, v in logs_of.items() if len(v) >= s.min_cases}
        centre = median(level.values()) if many and level else 0.0
        sigma = 1.4826 * median(abs(x - centre) for x in level.values()) if many and level else 0.0
        for d in devices:
            out[d] = _verdict(d, logs_of[d], family, scans.get(d, {}), len(devices) - 1, centre, sigma, limit, s)
    return out


def _reference(devices: Sequence[str], means: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    per_case: dict[str, list[float]] = defaultdict(list)
    for p in devices:
        for c, t in means[p].items():
            per_case[c].append(t)
    return {c: median(ts) for c, ts in per_case.items()}


def _verdict(device: str, logs: Mapping[str, float], family: Mapping[str, str],
             per_scan: Mapping[int, Mapping[str, tuple[int, float]]], peers: int, centre: float, sigma: float,
             limit: float, s: SlowSettings) -> Slowness:
    history, history_low = _history(per_scan, s)
    if peers == 0 or len(logs) < s.min_cases:
        if history_low is None:
            return Slowness(device=device, slow=False, peers=peers, cases=len(logs), history=history,
                            reason="nothing to compare with: no peer of its model with enough executions, one scan")
        slow = history_low > 1 + s.threshold
        return Slowness(device=device, slow=slow, basis="history", confidence="low", peers=peers, history=history,
                        threshold=s.threshold,
                        reason=f"its latest scan against its earlier ones: {history:.2f}x (lower bound "
                               f"{history_low:.2f}x), no peer of its model to compare with")
    mid = median(logs.values())
    low = median_lower_bound(list(logs.values()), s.confidence)
    by_family: dict[str, list[float]] = defaultdict(list)
    for c, x in logs.items():
        by_family[family[c]].append(x)
    families = {f: round(math.exp(median(xs)), 4) for f, xs in sorted(by_family.items())}
    many = peers >= s.min_peers
    slow = low is not None and low > limit and (not many or mid - centre > s.spread_z * sigma)
    if many:
        basis: SlowBasis = "peers"
        sure: Sureness = "high"
    else:
        basis = "pair"
        agrees = history_low is not None and history_low > 1 + s.threshold
        sure = "high" if slow and agrees else "medium"
    lo = None if low is None else math.exp(low)
    reason = (f"{math.exp(mid):.2f}x the time of {peers} peer(s) of its model over {len(logs)} cases"
              + ("" if lo is None else f" (lower {s.confidence:.0%} bound {lo:.2f}x)")
              + (f", {sigma:.3f} robust spread of the model's log slowdowns" if many else "")
              + ("" if history is None else f"; its latest scan {history:.2f}x its earlier ones"))
    return Slowness(device=device, slow=slow, slowdown=math.exp(mid), slowdown_low=lo, basis=basis, confidence=sure,
                    peers=peers, cases=len(logs), history=history, families=families, threshold=s.threshold,
                    reason=reason)


def peer_group(kind: str, model: str | None, host: str) -> str:
    """The peer group of a device: its kind and model; a device of unknown model is compared on its host only."""
    return f"{kind}|{model}" if model else f"{kind}|host:{host}"


def fleet_slowness(store: Store, *, since: float | None, settings: SlowSettings | None = None,
                   devices: Sequence[str] | None = None) -> dict[str, Slowness]:
    """Every device's verdict from the store: the golden cases' times since ``since`` (:func:`judge_slow`, the whole
    fleet as peers), and training jobs' ``slow`` incidents (a device named by one is slow, basis ``training``)."""
    s = settings or SlowSettings()
    known = store.devices()
    groups = {d.id: peer_group(d.kind, d.model, d.host) for d in known}
    # Per-scan rows only where a device's own history can matter (a group too small for a spread); everyone else
    # is judged on one row per device and case, so a large fleet's report reads a few rows per device.
    sizes = Counter(groups.values())
    small = sorted(d for d, g in groups.items() if sizes[g] <= s.min_peers)
    timings = [t for t in store.case_timings(since=since) if sizes[groups.get(t.device, t.device)] > s.min_peers]
    if small:
        timings += store.case_timings(since=since, devices=small, by_scan=True)
    verdicts = judge_slow(timings, groups, s)
    for i in store.incidents(since=since):
        if i.kind != SLOW_KIND or i.device is None:
            continue
        mine = verdicts.get(i.device)
        if mine is None or not mine.slow:
            verdicts[i.device] = Slowness(device=i.device, slow=True, basis="training", confidence="medium",
                                          slowdown=mine.slowdown if mine else None,
                                          slowdown_low=mine.slowdown_low if mine else None,
                                          families=mine.families if mine else {},
                                          reason=f"training job {i.job}, step {i.step}: {i.detail}")
    wanted = {d.id for d in known} if devices is None else set(devices)
    return {d: v for d, v in verdicts.items() if d in wanted}
