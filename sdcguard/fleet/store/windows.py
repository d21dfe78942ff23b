"""A window's counts from the running totals, the SQL :class:`~.counts.Counts` assembles: a key's whole days are its
totals less its running total on the eve of the window's first whole day (:func:`family_window`; the case tallies'
the same way, in :meth:`~.counts.Counts.case_times`), and the window's partial first day comes from rows, over the
time-led covering index ``results_time`` (:func:`partial_day`, :func:`add_partial_case_day`); failures and retests
are rare and come from their partial indexes, so no per-row expression is evaluated over millions of rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import StoreError
from .core import StoreCore, in_devices

__all__ = ["family_window", "partial_day", "add_partial_case_day"]


def family_window(core: StoreCore, keys: str, day: int, devices: Sequence[str] | None) -> list[tuple[Any, ...]]:
    """``(keys..., executions, failures, seconds)`` of the whole days from ``day`` on: each key's family totals
    less its running total on the eve (that day's row, read in day order over ``family_tallies_day``; else, a
    key not changed that day, its latest before), only for keys changed on the eve or later."""
    scope, sp = in_devices(devices, "t.device")
    floor = (
        "CASE WHEN t.first >= :day THEN 0 ELSE COALESCE(f.{0}, (SELECT x.{0} FROM family_tallies x WHERE "
        "x.device = t.device AND x.family = t.family AND x.day < :day ORDER BY x.day DESC LIMIT 1), 0) END"
    )
    grouped = ", ".join(f"t.{k.strip()}" for k in keys.split(","))
    sums = ", ".join(f"TOTAL(t.{c} - {floor.format(c)})" for c in ("executions", "failures", "test_s"))
    return core.rows(
        f"SELECT {grouped}, {sums} FROM family_totals t LEFT JOIN family_tallies f ON f.device = t.device "
        f"AND f.day = :day - 1 AND f.family = t.family WHERE t.day >= :day - 1{scope.replace('?', ':devices')} "
        f"GROUP BY {grouped}",
        {"day": day, "devices": sp[0] if sp else None},
    )


def partial_day(core: StoreCore, keys: str, lo: float, hi: float, scope: str, sp: list[Any]) -> list[tuple[Any, ...]]:
    """``(keys..., executions, failures, seconds)`` of the rows that started in ``[lo, hi)``, over the
    time-led covering index; failures and retests are rare and come from their partial indexes. A retest is
    always one execution (only passing first attempts are folded together), so first-attempt executions =
    TOTAL(executions) - retests."""
    width = keys.count(",") + 1
    where, params = f"WHERE started_at >= ? AND started_at < ?{scope}", [lo, hi, *sp]
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in core.rows(
        f"SELECT {keys}, TOTAL(executions), TOTAL(duration_s) FROM results "
        f"INDEXED BY results_time {where} GROUP BY {keys}",
        params,
    ):
        groups[tuple(r[:width])] = [r[width], 0.0, r[width + 1]]
    for r in core.rows(
        f"SELECT {keys}, COUNT(*) FROM results INDEXED BY results_retests {where} AND attempt > 0 GROUP BY {keys}",
        params,
    ):
        groups[tuple(r[:width])][0] -= r[width]
    for r in core.rows(
        f"SELECT {keys}, COUNT(*) FROM results INDEXED BY results_failures {where} "
        f"AND passed = 0 AND attempt = 0 GROUP BY {keys}",
        params,
    ):
        groups[tuple(r[:width])][1] += r[width]
    return [(*key, n, k, secs) for key, (n, k, secs) in groups.items()]


def add_partial_case_day(
    core: StoreCore, rows: list[tuple[Any, ...]], devices: Sequence[str] | None, lo: float, hi: float, sign: int
) -> None:
    """Add (``sign`` 1) or take away (-1) the passing first executions of the rows started in ``[lo, hi)`` to
    ``rows`` (``(device, case, family, executions, seconds)``, one per key), in place. Found by key, not by
    order: the server sorts text by its collation (ICU's en-US puts "a1" after "a_2", Python's byte order
    before), and one record per key needs no order. Every such key has a row (a tally that day)."""
    part, pp = in_devices(devices)
    partial: dict[str, dict[str, tuple[int, float]]] = {}
    for d, c, n, secs in core.rows(
        "SELECT device, case_id, TOTAL(executions), TOTAL(duration_s) FROM results INDEXED BY results_time "
        f"WHERE started_at >= ? AND started_at < ? AND passed = 1 AND attempt = 0{part} GROUP BY device, case_id",
        [lo, hi, *pp],
    ):
        partial.setdefault(d, {})[c] = (int(n), secs)
    found = 0
    for i, r in enumerate(rows) if partial else ():
        mine = partial.get(r[0])
        if mine is not None and r[1] in mine:
            n, secs = mine[r[1]]
            rows[i] = (r[0], r[1], r[2], r[3] + sign * n, r[4] + sign * secs)
            found += 1
    if found != sum(map(len, partial.values())):
        raise StoreError(f"fleet store {core.path}: result rows of a day its case tallies do not hold")
