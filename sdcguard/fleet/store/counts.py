"""Counts over a window (``store.counts``): executions, failures and testing time per device and family (the
rates), complete scans per device, the clean scans that end a probation, a rate's series over time, and the slowness
statistic's times per device and case.

Which executions count: every recorded first attempt (``attempt = 0``) of a golden case, whatever became of its
scan (a scanner killed mid-scan must not hide the failures it already found); a retest is run *because* a case
failed and would bias the rate, so it counts in testing time only. A row may stand for many passing executions
(``executions``); a failed execution is always one row.

Windows: a row counts when it started at or after ``since`` (a passing row: its first execution). Scans older
than the retention horizon (``sdcguard prune``) live as per-day roll-ups; a rolled-up day counts when it starts
at or after ``since``, so beyond the horizon a window's start is resolved to the UTC day.

Counts over whole UTC days come from running totals, never from rows: the family tallies (two rows per device and
family whatever the window) or the day tallies for the days still held as rows (kept exact as rows are written,
merged and pruned: :mod:`.writes.tallies`), the roll-ups for pruned days; the slowness statistic's times the same way
from the case tallies. Rows are read only for the partial first day of a window (:mod:`.windows`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from itertools import compress
from typing import Any, Literal

import numpy as np

from ...durations import DAY_S
from .core import StoreCore, first_day, in_devices
from .rows import CaseTimes, CaseTiming, ScanCounts, SeriesPoint, Tally
from .schema.tables import COUNTED_SCAN
from .windows import add_partial_case_day, family_window, partial_day

__all__ = ["Counts"]


class Counts:
    """Counts over a window, from the running totals and the roll-ups (rows only for a partial first day).

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def tallies(
        self,
        *,
        since: float | None = None,
        devices: Sequence[str] | None = None,
        by: Literal["device", "device_family", "family"] = "device_family",
    ) -> list[Tally]:
        """Executions, failures and testing seconds grouped ``by`` device, device and family, or family; rows of
        the retention horizon's roll-ups included. Ordered by the grouping keys."""
        keys = {"device": "device", "device_family": "device, family", "family": "family"}[by]
        width = keys.count(",") + 1
        scope, sp = in_devices(devices)
        groups: dict[tuple[Any, ...], list[float]] = {}

        def add(rows: list[tuple[Any, ...]]) -> None:
            for r in rows:
                g = groups.setdefault(tuple(r[:width]), [0.0, 0.0, 0.0])
                g[0] += r[width]
                g[1] += r[width + 1]
                g[2] += r[width + 2]

        # Whole days from the family tallies (a window from the horizon on: two running totals per device and
        # family) or the day tallies (the rows held), and the roll-ups (the days pruned); rows only for the partial
        # first day of the window, from its start to the next UTC midnight.
        day = first_day(since)
        horizon = self._core.pruned_before
        if day is not None and since is not None and (horizon is None or since >= horizon):
            add(family_window(self._core, keys, day, devices))
        else:
            window, wp = ("", []) if day is None else (" AND day >= ?", [day])
            add(
                self._core.rows(
                    f"SELECT {keys}, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM day_tallies "
                    f"WHERE true{window}{scope} GROUP BY {keys}",
                    [*wp, *sp],
                )
            )
        if since is not None and day is not None and day * DAY_S > since:
            add(partial_day(self._core, keys, since, day * DAY_S, scope, sp))
        if self._core.has_rollups(since):
            table, window, wp = ("rollup_totals", "", []) if day is None else ("rollups", " AND day >= ?", [day])
            add(
                self._core.rows(
                    f"SELECT {keys}, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM {table} "
                    f"WHERE true{window}{scope} GROUP BY {keys}",
                    [*wp, *sp],
                )
            )
        out = []
        for key in sorted(groups):
            n, k, s = groups[key]
            if n == 0 and k == 0 and abs(s) < 1e-6:
                continue  # what a day tally keeps of rows that moved or went: nothing
            device = key[0] if by != "family" else None
            family = key[-1] if by != "device" else None
            out.append(Tally(device, family, int(n), int(k), s))
        return out

    def scans(
        self, *, since: float | None, device: str | None = None, devices: Sequence[str] | None = None
    ) -> dict[str, ScanCounts]:
        """Per device (every one, ``device`` or ``devices``): complete scans started in the window, and the end of
        its latest complete scan ever (a scan counts when :data:`~.schema.tables.COUNTED_SCAN`)."""
        if device is not None:
            devices = [device]
        dev, dp = in_devices(devices)
        window, wp = (" AND started_at >= ?", [since]) if since is not None else ("", [])
        complete: dict[str, int] = {
            d: int(n)
            for d, n in self._core.rows(
                f"SELECT device, COUNT(*) FROM scans INDEXED BY scans_counted WHERE {COUNTED_SCAN}{window}{dev} "
                "GROUP BY device",
                [*wp, *dp],
            )
        }
        # One index entry per device (scans_counted, named: with executions in the condition the planner would
        # otherwise pick scans_status and read every complete scan per device; it holds only the scans that count,
        # in the order the latest is found in, with its end, so neither backend reads a table row or sorts): a
        # device's scans never overlap (the scanner locks it), so its latest complete scan is the one started last.
        # The counts read the same index whole, in device order, without the table.
        one, op = in_devices(devices, "d.id")
        last: dict[str, float] = {
            d: t
            for d, t in self._core.rows(
                "SELECT d.id, (SELECT COALESCE(s.finished_at, s.started_at) FROM scans s INDEXED BY scans_counted "
                "WHERE s.device = d.id AND "
                f"{COUNTED_SCAN} ORDER BY s.started_at DESC, s.id DESC LIMIT 1) AS t FROM devices d "
                f"WHERE true{one}",
                op,
            )
            if t is not None
        }
        if self._core.meta("rollup_last_day") is not None:
            day = first_day(since)
            if day is None:
                rolled = self._core.rows(f"SELECT device, complete FROM scan_rollup_totals WHERE true{dev}", dp)
            elif self._core.has_rollups(since):
                rolled = self._core.rows(
                    f"SELECT device, TOTAL(complete) FROM scan_rollups WHERE day >= ?{dev} GROUP BY device", [day, *dp]
                )
            else:
                rolled = []
            for d, n in rolled:
                complete[d] = complete.get(d, 0) + int(n)
            for d, t in self._core.rows(f"SELECT device, last_complete FROM scan_rollup_totals WHERE true{dev}", dp):
                if t is not None and (d not in last or t > last[d]):
                    last[d] = t
        return {d: ScanCounts(complete.get(d, 0), last.get(d)) for d in {*complete, *last}}

    def clean_scans(self, since: Mapping[str, float]) -> dict[str, int]:
        """For each device, its complete scans without a failure that started at or after its own time (a scan
        that executed nothing is not one: :data:`~.schema.tables.COUNTED_SCAN`)."""
        if not since:
            return {}
        rows = self._core.rows(
            "SELECT s.device, COUNT(*) FROM scans s JOIN json_each(?) j ON j.key = s.device "
            f"WHERE s.started_at >= CAST(j.value AS REAL) AND {COUNTED_SCAN} AND s.failures = 0 GROUP BY s.device",
            (json.dumps(dict(since)),),
        )
        return {d: int(n) for d, n in rows}

    def case_times(self, *, since: float | None, devices: Sequence[str] | None = None) -> CaseTimes:
        """Passing first executions per device and case since ``since`` and their summed device time, one record
        per device and case (``scan`` 0): the slowness statistic's input (:mod:`sdcguard.fleet.slow`).

        Whole days come from the case tallies: a key's totals less its running total on the eve of the window's
        first whole day (that day's row, else the latest before it): two rows per device and case whatever the
        window's length. The partial first day comes from rows, over the covering index ``results_time``: those
        from the window's start to midnight are added, or, when fewer, the day's rows before the start are taken
        from the whole day (the tallies from the eve of the partial day on). Executions a prune deleted still
        count; the tallies keep no day before the retention horizon apart, so a window that starts before it
        counts from the horizon (all time, ``since=None``, counts every execution). Records come in no particular
        order."""
        scope, sp = in_devices(devices, "t.device")
        if since is None:
            return CaseTimes.from_rows(
                self._core.rows(
                    f"SELECT device, case_id, family, executions, seconds FROM case_totals t WHERE true{scope}", sp
                ),
                scan=0,
            )
        horizon = self._core.pruned_before
        start = since if horizon is None or since >= horizon else horizon
        day = math.ceil(start / DAY_S)
        params: dict[str, Any] = {
            "day": day,
            "devices": sp[0] if sp else None,
            "lo": start,
            "hi": day * DAY_S,
            "sign": 1,
        }
        if day * DAY_S > start:  # the day's rows before the start, or after it: whichever are fewer
            count = (
                "SELECT COUNT(*) FROM (SELECT 1 FROM results INDEXED BY results_time WHERE started_at >= ? AND "
                "started_at < ? LIMIT ?) AS day_rows"
            )
            after, before = (
                self._core.one(count, (lo, hi, 1000)) for lo, hi in ((start, day * DAY_S), ((day - 1) * DAY_S, start))
            )
            if after == before == 1000:
                after, before = (
                    self._core.one(count, (lo, hi, 2**62))
                    for lo, hi in ((start, day * DAY_S), ((day - 1) * DAY_S, start))
                )
            if before < after:
                params.update(day=day - 1, lo=(day - 1) * DAY_S, hi=start, sign=-1)
        # a key's running total on the eve: none when its first tally is later, else that day's row, else (a key
        # not changed that day) its latest before
        floor = (
            "CASE WHEN t.first >= :day THEN 0 ELSE COALESCE(f.{0}, (SELECT x.{0} FROM case_tallies x WHERE "
            "x.device = t.device AND x.case_id = t.case_id AND x.day < :day ORDER BY x.day DESC LIMIT 1), 0) END"
        )
        rows = self._core.rows(  # keys changed on the eve or later (those changed before have nothing in the window)
            f"SELECT t.device, t.case_id, t.family, t.executions - {floor.format('executions')}, "
            f"t.seconds - {floor.format('seconds')} FROM case_totals t LEFT JOIN case_tallies f ON f.device = t.device "
            f"AND f.day = :day - 1 AND f.case_id = t.case_id WHERE t.day >= :day - 1{scope.replace('?', ':devices')}",
            params,
        )
        if params["lo"] < params["hi"]:  # the partial day's rows, added (sign 1) or taken away (-1), key by key
            add_partial_case_day(self._core, rows, devices, params["lo"], params["hi"], params["sign"])
        times = CaseTimes.from_rows(rows, scan=0)
        executions = np.asarray(times.executions, dtype=np.int64)
        if (executions <= 0).any():  # a key with nothing passing in the window (a column test, not a row loop)
            keep = (executions > 0).tolist()
            times = CaseTimes(
                list(compress(times.device, keep)),
                list(compress(times.case, keep)),
                list(compress(times.family, keep)),
                list(compress(times.scan, keep)),
                list(compress(times.executions, keep)),
                list(compress(times.seconds, keep)),
            )
        return times

    def case_timings(self, *, since: float | None, devices: Sequence[str]) -> list[CaseTiming]:
        """Passing first executions per device, scan and case since ``since``, with their summed device time, for
        ``devices`` (those whose own history the slowness statistic weighs); read scan by scan from each device's
        scans, so a few devices cost a few of their rows however large the store. Pruned scans are gone."""
        scope, sp = in_devices(devices, "s.device")
        window, wp = (" AND r.started_at >= ?", [since]) if since is not None else ("", [])
        rows = self._core.rows(
            "SELECT r.device, r.scan, r.case_id, MIN(r.family), TOTAL(r.executions), TOTAL(r.duration_s) "
            "FROM scans s INDEXED BY scans_device JOIN results r ON r.scan = s.id "
            f"WHERE r.device = s.device AND r.passed = 1 AND r.attempt = 0{scope}{window} "
            "GROUP BY r.device, r.scan, r.case_id",
            [*sp, *wp],
        )
        return [
            CaseTiming(device=d, scan=int(s), case=c, family=f, executions=int(n), seconds=float(t))
            for d, s, c, f, n, t in rows
        ]

    def series(self, *, start: float, width_s: float, devices: Sequence[str] | None) -> list[SeriesPoint]:
        """Executions and failures per ``width_s`` bin from ``start``, per device (``devices``) or for the fleet
        (None); a rolled-up day falls in the bin of its start."""
        per_device = devices is not None
        keys = "device, b" if per_device else "b"
        scope, sp = in_devices(devices)
        sums: dict[tuple[str | None, int], list[int]] = {}
        for r in self._core.rows(
            f"SELECT {keys}, TOTAL(CASE WHEN attempt = 0 THEN executions ELSE 0 END), "
            "TOTAL(CASE WHEN attempt = 0 AND passed = 0 THEN 1 ELSE 0 END) FROM "
            f"(SELECT *, CAST((started_at - ?) / ? AS INTEGER) AS b FROM results WHERE started_at >= ?{scope}) "
            f"AS binned GROUP BY {keys}",
            [start, width_s, start, *sp],
        ):
            key = (r[0], int(r[1])) if per_device else (None, int(r[0]))
            sums[key] = [int(r[-2]), int(r[-1])]
        if self._core.has_rollups(start):
            table = "rollups" if per_device else "rollup_days"  # the fleet's: one row a day
            for r in self._core.rows(
                f"SELECT {keys}, TOTAL(executions), TOTAL(failures) FROM (SELECT *, CAST((day * {DAY_S} - ?) / ? "
                f"AS INTEGER) AS b FROM {table} WHERE day >= ?{scope}) AS binned GROUP BY {keys}",
                [start, width_s, first_day(start), *sp],
            ):
                key = (r[0], int(r[1])) if per_device else (None, int(r[0]))
                s = sums.setdefault(key, [0, 0])
                s[0] += int(r[-2])
                s[1] += int(r[-1])
        return [
            SeriesPoint(d, b, n, k)
            for (d, b), (n, k) in sorted(sums.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
        ]

    def first_execution(self) -> float | None:
        """When the oldest recorded execution started (roll-ups included), None for an empty store."""
        t = self._core.one("SELECT MIN(started_at) FROM results")
        day = self._core.one("SELECT MIN(day) FROM rollups") if self._core.meta("rollup_last_day") is not None else None
        candidates = [x for x in (t, None if day is None else day * DAY_S) if x is not None]
        return min(candidates) if candidates else None
