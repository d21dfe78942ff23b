"""Slow devices: the same golden cases, timed on devices of one model, compared robustly.

A degraded device (throttling, a bad fan, a downclocked bus) returns right numbers slowly. The golden suite runs
identical work (the same case, the same inputs) on every device of a model, and the store keeps, per scan and
case, how many passing executions there were and their summed time. The scanner times what the device did (the
thread's CPU time on a pinned core, kernel time on a GPU), not wall time, so preemption on a loaded host is not
slowness.

The rule, a pure function of :class:`~.store.rows.CaseTiming` records or their columns (:class:`~.store.rows.CaseTimes`;
:func:`judge_slow`):

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

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..durations import iso_utc
from ..medians import lower_rank, median_lower_bound
from .store.rows import CaseTimes, CaseTiming

if TYPE_CHECKING:
    pass

__all__ = ["SlowSettings", "Slowness", "Sureness", "SlowBasis", "judge_slow", "peer_group"]

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


@dataclass(kw_only=True, slots=True)
class Slowness:
    """One device's slowness verdict. A value: treat it as read-only. (Not ``frozen``, as :class:`~.rates.Rate`: a
    report of 100,000 devices builds one each, and frozen dataclasses take twice as long to construct.)"""

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
    judged_at: float | None = None
    """When the verdict was computed, for a verdict kept in the store (:func:`fleet_slowness`'s ``max_age_s``);
    None: computed for this read."""

    def as_dict(self) -> dict[str, object]:
        """The report's ``slow*`` fields."""
        return {
            "slow": self.slow,
            "slowdown": _round(self.slowdown),
            "slowdown_low": _round(self.slowdown_low),
            "slow_basis": self.basis,
            "slow_confidence": self.confidence,
            "slow_judged_at": _judged_text(self.judged_at),
        }


@functools.lru_cache(maxsize=8)
def _judged_text(t: float | None) -> str | None:
    """:func:`~..durations.iso_utc`, kept for the few times verdicts are judged at (every verdict kept together
    shares one: a report of 100,000 devices wrote the same text 100,000 times)."""
    return iso_utc(t)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _columns(timings: Iterable[CaseTiming] | CaseTimes) -> CaseTimes:
    return timings if isinstance(timings, CaseTimes) else CaseTimes.from_records(timings)


def _means(
    times: CaseTimes, settings: SlowSettings
) -> tuple[list[str], np.ndarray, list[str], np.ndarray, np.ndarray, dict[str, str]]:
    """Per device and case, the mean seconds per passing execution over every record (records without an execution
    or a second are left out; cases under ``min_executions`` executions are dropped after summing): the devices (every
    one with a record, sorted), and per (device, case) pair its device index, the cases, its case index, its mean;
    and each case's family (the last record's). Sums run in record order, as a loop over the records would."""
    n = np.asarray(times.executions, dtype=np.int64)
    secs = np.asarray(times.seconds, dtype=np.float64)
    keep = (n > 0) & (secs > 0)
    device, case, family_of = times.device, times.case, times.family
    if not keep.all():
        mask = keep.tolist()
        device, case, family_of = ([x for x, k in zip(col, mask) if k] for col in (device, case, family_of))
        n, secs = n[keep], secs[keep]
    family = dict(zip(case, family_of))
    devices = sorted(set(device))
    cases = sorted(family)
    width = max(len(cases), 1)
    d_index = np.fromiter(map({d: i for i, d in enumerate(devices)}.__getitem__, device), np.int64, len(device))
    c_index = np.fromiter(map({c: i for i, c in enumerate(cases)}.__getitem__, case), np.int64, len(case))
    key = d_index * width + c_index  # one slot per (device, case): summed in place, no sort
    size = len(devices) * width
    total_n = np.bincount(key, weights=n, minlength=size)
    total_s = np.bincount(key, weights=secs, minlength=size)
    pairs = np.flatnonzero(total_n >= settings.min_executions)
    return devices, pairs // width, cases, pairs % width, total_s[pairs] / total_n[pairs], family


def _per_scan(times: CaseTimes) -> dict[str, dict[int, dict[str, tuple[int, float]]]]:
    """Per device, scan and case: (executions, seconds), records without an execution or a second left out."""
    scans: dict[str, dict[int, dict[str, tuple[int, float]]]] = defaultdict(lambda: defaultdict(dict))
    for d, c, sc, n, t in zip(times.device, times.case, times.scan, times.executions, times.seconds):
        if n <= 0 or t <= 0:
            continue
        was_n, was_s = scans[d][sc].get(c, (0, 0.0))
        scans[d][sc][c] = (was_n + n, was_s + t)
    return scans


def _history(
    per_scan: Mapping[int, Mapping[str, tuple[int, float]]], settings: SlowSettings
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
    logs = [
        math.log((s / n) / (before[c][1] / before[c][0]))
        for c, (n, s) in per_scan[latest].items()
        if n >= settings.min_executions and before[c][0] >= settings.min_executions
    ]
    if len(logs) < settings.min_cases:
        return None, None
    low = median_lower_bound(logs, settings.confidence)
    return math.exp(median(logs)), None if low is None else math.exp(low)


def _row_medians(rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The median of the first ``counts[i]`` values of each row of ``rows`` (sorted along the row, what follows them
    ``inf``), as :func:`statistics.median`: the middle value, or the mean of the two middle values, which for one
    value is that value exactly. Rows with no value give ``inf``."""
    at = np.arange(len(rows))
    low, high = np.maximum(counts - 1, 0) // 2, counts // 2
    return (rows[at, low] + rows[at, np.minimum(high, rows.shape[1] - 1)]) / 2


def judge_slow(
    timings: Iterable[CaseTiming] | CaseTimes,
    groups: Mapping[str, str],
    settings: SlowSettings | None = None,
    *,
    history: Iterable[CaseTiming] | CaseTimes | None = None,
) -> dict[str, Slowness]:
    """The slowness verdict of every device in ``timings`` (see the module docstring).

    ``groups``: device -> its peer group (model, kind and, for an unknown model, host); devices of one group are
    peers. A device missing from ``groups`` is its own group. ``history``: per-scan records of the devices whose
    own history is weighed (their latest scan against their earlier ones); None: the scans of ``timings`` itself.

    A model with ``min_peers`` or more peers per device (a fleet's bulk) is judged with arrays, per (device, case)
    pair; smaller groups device by device. Both compute the same medians of the same values in the same order.
    """
    s = settings or SlowSettings()
    times = _columns(timings)
    devices, dev, cases, case, mean, family = _means(times, s)
    scans = _per_scan(times if history is None else _columns(history))
    members: dict[str, list[int]] = defaultdict(list)
    for i, d in enumerate(devices):
        members[groups.get(d, d)].append(i)
    limit = math.log1p(s.threshold)
    out: dict[str, Slowness] = {}
    big = {g: m for g, m in members.items() if len(m) - 1 >= s.min_peers}
    many = _judge_many(devices, dev, cases, case, mean, family, big, scans, limit, s) if big else {}
    if len(big) == len(members):
        return {devices[i]: many[devices[i]] for m in members.values() for i in m}
    by_device: dict[int, dict[str, float]] = defaultdict(dict)
    small = {i for g, m in members.items() if g not in big for i in m}
    for i, c, t in zip(dev.tolist(), case.tolist(), mean.tolist()):
        if i in small:
            by_device[i][cases[c]] = t
    for g, m in members.items():
        if g in big:
            out.update((devices[i], many[devices[i]]) for i in m)
            continue
        logs_of: dict[int, dict[str, float]] = {}
        for i in m:
            ref = _reference([by_device[p] for p in m if p != i])
            logs_of[i] = {c: math.log(t / ref[c]) for c, t in by_device[i].items() if c in ref}
        for i in m:
            logs = logs_of[i]
            summary = None
            if logs and len(logs) >= s.min_cases:
                xs = sorted(logs.values())
                by_family: dict[str, list[float]] = defaultdict(list)
                for c, x in logs.items():
                    by_family[family[c]].append(x)
                summary = (
                    median(xs),
                    median_lower_bound(xs, s.confidence),
                    {f: round(math.exp(median(v)), 4) for f, v in sorted(by_family.items())},
                )
            out[devices[i]] = _verdict(
                devices[i], len(logs), summary, scans.get(devices[i], {}), len(m) - 1, 0.0, 0.0, limit, s
            )
    return out


def _reference(peers: Sequence[Mapping[str, float]]) -> dict[str, float]:
    per_case: dict[str, list[float]] = defaultdict(list)
    for means in peers:
        for c, t in means.items():
            per_case[c].append(t)
    return {c: median(ts) for c, ts in per_case.items()}


def _judge_many(
    devices: Sequence[str],
    dev: np.ndarray,
    cases: Sequence[str],
    case: np.ndarray,
    mean: np.ndarray,
    family: Mapping[str, str],
    big: Mapping[str, Sequence[int]],
    scans: Mapping[str, Mapping[int, Mapping[str, tuple[int, float]]]],
    limit: float,
    s: SlowSettings,
) -> dict[str, Slowness]:
    """The verdicts of the devices of groups with ``min_peers`` or more peers each, with arrays: one reference per
    group and case (the median of its devices' means), each pair's log slowdown, each device's median and lower
    bound over its cases and per family, each group's median level and robust spread."""
    group = np.full(len(devices), -1, np.int64)
    for g, m in enumerate(big.values()):
        group[list(m)] = g
    pick = group[dev] >= 0
    dev, case, mean = dev[pick], case[pick], mean[pick]
    # One row per device, one column per case, inf where the device has no time for the case: every median below is
    # a sort along short rows (a group's devices, a device's cases), never a sort of every pair by compound keys,
    # which took 1.4-1.8 s per sort at 100,000 devices (3.1 million pairs; these take about 0.2 s in all). Memory:
    # three tables of devices x cases floats (75 MB for 100,000 devices and the suite's 31 cases), more than the pairs
    # only where devices ran few of the cases.
    table = np.full((len(devices), len(cases)), np.inf)
    table[dev, case] = mean
    ref = np.empty((len(big), len(cases)))
    for g, m in enumerate(big.values()):
        by_case = np.sort(table[list(m)], axis=0).T
        ref[g] = _row_medians(by_case, np.isfinite(by_case).sum(axis=1))
    logs = np.fromiter(map(math.log, (mean / ref[group[dev], case]).tolist()), np.float64, len(mean))
    table[dev, case] = logs
    mine = np.sort(table, axis=1)
    counts = np.isfinite(mine).sum(axis=1)
    owners = np.flatnonzero(counts).tolist()
    d_counts = counts[owners]
    mids = _row_medians(mine[owners], d_counts).tolist()
    ranks = [lower_rank(n, s.confidence) for n in d_counts.tolist()]
    lows = [float(mine[i, k - 1]) if k else None for i, k in zip(owners, ranks)]
    fam_names = sorted(set(family.values()))
    fam_of_case = np.array([fam_names.index(family[c]) for c in cases], np.int64)
    families: dict[int, dict[str, float]] = {i: {} for i in owners}
    owned, owner_index = table[owners], np.asarray(owners, np.int64)
    for f, name in enumerate(fam_names):
        of_family = np.sort(owned[:, fam_of_case == f], axis=1)
        n_f = np.isfinite(of_family).sum(axis=1)
        has = np.flatnonzero(n_f)
        for i, x in zip(owner_index[has].tolist(), _row_medians(of_family[has], n_f[has]).tolist()):
            families[i][name] = round(math.exp(x), 4)
    cases_of = dict(zip(owners, d_counts.tolist()))
    summary = {i: (mid, low) for i, mid, low, n in zip(owners, mids, lows, d_counts.tolist()) if n >= s.min_cases}
    out: dict[str, Slowness] = {}
    for m in big.values():
        level = [summary[i][0] for i in m if i in summary]
        centre = median(level) if level else 0.0
        sigma = 1.4826 * median(abs(x - centre) for x in level) if level else 0.0
        for i in m:
            info = (*summary[i], families[i]) if i in summary else None
            out[devices[i]] = _verdict(
                devices[i], cases_of.get(i, 0), info, scans.get(devices[i], {}), len(m) - 1, centre, sigma, limit, s
            )
    return out


def _verdict(
    device: str,
    cases: int,
    summary: tuple[float, float | None, dict[str, float]] | None,
    per_scan: Mapping[int, Mapping[str, tuple[int, float]]],
    peers: int,
    centre: float,
    sigma: float,
    limit: float,
    s: SlowSettings,
) -> Slowness:
    """One device's verdict from its ``cases`` compared and, when there are ``min_cases`` of them, ``summary``:
    the median log slowdown, its lower bound (None: too few cases) and the slowdown per family."""
    history, history_low = _history(per_scan, s)
    if peers == 0 or summary is None:
        if history_low is None:
            return Slowness(
                device=device,
                slow=False,
                peers=peers,
                cases=cases,
                history=history,
                reason="nothing to compare with: no peer of its model with enough executions, one scan",
            )
        slow = history_low > 1 + s.threshold
        return Slowness(
            device=device,
            slow=slow,
            basis="history",
            confidence="low",
            peers=peers,
            history=history,
            threshold=s.threshold,
            reason=f"its latest scan against its earlier ones: {history:.2f}x (lower bound "
            f"{history_low:.2f}x), no peer of its model to compare with",
        )
    mid, low, families = summary
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
    reason = (
        f"{math.exp(mid):.2f}x the time of {peers} peer(s) of its model over {cases} cases"
        + ("" if lo is None else f" (lower {s.confidence:.0%} bound {lo:.2f}x)")
        + (f", {sigma:.3f} robust spread of the model's log slowdowns" if many else "")
        + ("" if history is None else f"; its latest scan {history:.2f}x its earlier ones")
    )
    return Slowness(
        device=device,
        slow=slow,
        slowdown=math.exp(mid),
        slowdown_low=lo,
        basis=basis,
        confidence=sure,
        peers=peers,
        cases=cases,
        history=history,
        families=families,
        threshold=s.threshold,
        reason=reason,
    )


def peer_group(kind: str, model: str | None, host: str) -> str:
    """The peer group of a device: its kind and model; a device of unknown model is compared on its host only."""
    return f"{kind}|{model}" if model else f"{kind}|host:{host}"
