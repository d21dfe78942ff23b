"""The slowness rule written from its definition (the docstring of :mod:`sdcguard.fleet.slow`), device by device
with dicts and :mod:`statistics`, kept as the reference the array version of :func:`sdcguard.fleet.slow.judge_slow`
is property-tested against. Nothing here calls the library's rule or its statistics: the history comparison and the
sign test's bound are computed here from their definitions.

Where the definition leaves a choice, the library's is spelled out and followed: a median of slowdowns is taken in
log space (for an even count, the mean of the two middle logs); a case's time in a scan is the scan's seconds over
its executions, summed record by record; the earlier scans' time is their seconds over their executions, summed
scan by scan. Sums of two numbers are the same whichever comes first, so with at most two earlier scans per
device (what the property test draws) every value here equals the library's to the bit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from statistics import median

from sdcguard.fleet.slow import SlowBasis, Slowness, SlowSettings, Sureness
from sdcguard.fleet.store.rows import CaseTiming

__all__ = ["reference_judge_slow", "sign_test_lower_bound"]


def sign_test_lower_bound(values: Sequence[float], confidence: float) -> float | None:
    """The distribution-free lower confidence bound on the median: the largest order statistic ``x_(k)`` such that
    ``P(Binomial(n, 1/2) < k) <= 1 - confidence``, in exact arithmetic; None when no ``k >= 1`` qualifies."""
    xs = sorted(values)
    n, alpha = len(xs), Fraction(1) - Fraction(confidence)
    k, below = 0, 0  # below: the count of outcomes with fewer than k + 1 successes, times 2**n
    while k < n and Fraction(below + math.comb(n, k), 2**n) <= alpha:
        below += math.comb(n, k)
        k += 1
    return xs[k - 1] if k else None


def _times(
    timings: Iterable[CaseTiming], settings: SlowSettings
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
    means = {d: {c: s / n for c, (n, s) in cases.items() if n >= settings.min_executions} for d, cases in total.items()}
    return means, family, scans


def _log_median(logs: Sequence[float]) -> float:
    xs = sorted(logs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def _history(
    per_scan: Mapping[int, Mapping[str, tuple[int, float]]], settings: SlowSettings
) -> tuple[float | None, float | None]:
    """The device's own history: "its latest scan against its earlier scans in the window (median over cases;
    None: one scan)", and the lower bound that decides a verdict on history alone.

    The latest scan is the one with the highest id. A case counts when the latest scan ran it ``min_executions``
    times or more and the earlier scans together did too; its slowdown is the latest scan's time per execution over
    the earlier scans' (their seconds over their executions). With fewer than ``min_cases`` such cases the history
    says nothing (None, None); else (the median slowdown, the sign test's lower bound on it)."""
    if len(per_scan) < 2:
        return None, None
    *earlier, latest = sorted(per_scan)
    logs = []
    for case, (runs, seconds) in per_scan[latest].items():
        before = [per_scan[scan][case] for scan in earlier if case in per_scan[scan]]
        runs_before = sum(n for n, _ in before)
        seconds_before = sum(s for _, s in before)
        if runs < settings.min_executions or runs_before < settings.min_executions:
            continue
        logs.append(math.log((seconds / runs) / (seconds_before / runs_before)))
    if len(logs) < settings.min_cases:
        return None, None
    low = sign_test_lower_bound(logs, settings.confidence)
    return math.exp(_log_median(logs)), None if low is None else math.exp(low)


def reference_judge_slow(
    timings: Iterable[CaseTiming], groups: Mapping[str, str], settings: SlowSettings | None = None
) -> dict[str, Slowness]:
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


def _verdict(
    device: str,
    logs: Mapping[str, float],
    family: Mapping[str, str],
    per_scan: Mapping[int, Mapping[str, tuple[int, float]]],
    peers: int,
    centre: float,
    sigma: float,
    limit: float,
    s: SlowSettings,
) -> Slowness:
    history, history_low = _history(per_scan, s)
    if peers == 0 or len(logs) < s.min_cases:
        if history_low is None:
            return Slowness(
                device=device,
                slow=False,
                peers=peers,
                cases=len(logs),
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
    mid = median(logs.values())
    low = sign_test_lower_bound(list(logs.values()), s.confidence)
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
    reason = (
        f"{math.exp(mid):.2f}x the time of {peers} peer(s) of its model over {len(logs)} cases"
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
        cases=len(logs),
        history=history,
        families=families,
        threshold=s.threshold,
        reason=reason,
    )
