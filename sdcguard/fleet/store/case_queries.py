"""The slowness statistic's inputs from the store: passing first executions per device and case and their summed
device time, from the case tallies (schema version 10, :mod:`.schema.tally_tables`; kept by :mod:`.maintenance`) for
whole days and from rows for a window's partial first day; and per scan for the few devices whose own history the
statistic weighs. :class:`CaseQueries` is a part of the store's read queries (:class:`~.queries.StoreQueries` builds on
it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import compress
from typing import Any

import numpy as np

from ...durations import DAY_S
from ...errors import StoreError
from .connection import StoreBase
from .core import in_devices
from .rows import CaseTimes, CaseTiming

__all__ = ["CaseQueries"]


class CaseQueries(StoreBase):
    """The case tallies' and the per-scan timing reads (see the module docstring)."""

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
                self._rows(
                    f"SELECT device, case_id, family, executions, seconds FROM case_totals t WHERE true{scope}", sp
                ),
                scan=0,
            )
        horizon = self.pruned_before
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
                self._one(count, (lo, hi, 1000)) for lo, hi in ((start, day * DAY_S), ((day - 1) * DAY_S, start))
            )
            if after == before == 1000:
                after, before = (
                    self._one(count, (lo, hi, 2**62)) for lo, hi in ((start, day * DAY_S), ((day - 1) * DAY_S, start))
                )
            if before < after:
                params.update(day=day - 1, lo=(day - 1) * DAY_S, hi=start, sign=-1)
        # a key's running total on the eve: none when its first tally is later, else that day's row, else (a key
        # not changed that day) its latest before
        floor = (
            "CASE WHEN t.first >= :day THEN 0 ELSE COALESCE(f.{0}, (SELECT x.{0} FROM case_tallies x WHERE "
            "x.device = t.device AND x.case_id = t.case_id AND x.day < :day ORDER BY x.day DESC LIMIT 1), 0) END"
        )
        rows = self._rows(  # keys changed on the eve or later (those changed before have nothing in the window)
            f"SELECT t.device, t.case_id, t.family, t.executions - {floor.format('executions')}, "
            f"t.seconds - {floor.format('seconds')} FROM case_totals t LEFT JOIN case_tallies f ON f.device = t.device "
            f"AND f.day = :day - 1 AND f.case_id = t.case_id WHERE t.day >= :day - 1{scope.replace('?', ':devices')}",
            params,
        )
        if params["lo"] < params["hi"]:  # the partial day's rows, added (sign 1) or taken away (-1), key by key
            self._partial_case_day(rows, devices, params["lo"], params["hi"], params["sign"])
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

    def _partial_case_day(
        self, rows: list[tuple[Any, ...]], devices: Sequence[str] | None, lo: float, hi: float, sign: int
    ) -> None:
        """Add (``sign`` 1) or take away (-1) the passing first executions of the rows started in ``[lo, hi)`` to
        ``rows`` (``(device, case, family, executions, seconds)``, one per key), in place. Found by key, not by
        order: the server sorts text by its collation (ICU's en-US puts "a1" after "a_2", Python's byte order
        before), and one record per key needs no order. Every such key has a row (a tally that day)."""
        part, pp = in_devices(devices)
        partial: dict[str, dict[str, tuple[int, float]]] = {}
        for d, c, n, secs in self._rows(
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
            raise StoreError(f"fleet store {self.path}: result rows of a day its case tallies do not hold")

    def case_timings(self, *, since: float | None, devices: Sequence[str]) -> list[CaseTiming]:
        """Passing first executions per device, scan and case since ``since``, with their summed device time, for
        ``devices`` (those whose own history the slowness statistic weighs); read scan by scan from each device's
        scans, so a few devices cost a few of their rows however large the store. Pruned scans are gone."""
        scope, sp = in_devices(devices, "s.device")
        window, wp = (" AND r.started_at >= ?", [since]) if since is not None else ("", [])
        rows = self._rows(
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
