"""The store's counts over a window, from its running totals: executions, failures and testing time (the day
tallies for whole UTC days held as rows, the roll-ups for pruned days, rows only for a window's partial first day)
and complete scans per device (see :mod:`.queries` for which executions count)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ...durations import DAY_S
from .connection import StoreBase
from .core import first_day, in_devices
from .rows import ScanCounts, Tally
from .schema.tables import COUNTED_SCAN

__all__ = ["TallyQueries"]


class TallyQueries(StoreBase):
    """Counts over a window (part of :class:`sdcguard.fleet.store.store.Store`)."""

    # ------------------------------------------------------------------ rates
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
        horizon = self.pruned_before
        if day is not None and since is not None and (horizon is None or since >= horizon):
            add(self._family_window(keys, day, devices))
        else:
            window, wp = ("", []) if day is None else (" AND day >= ?", [day])
            add(
                self._rows(
                    f"SELECT {keys}, TOTAL(executions), TOTAL(failures), TOTAL(test_s) FROM day_tallies "
                    f"WHERE true{window}{scope} GROUP BY {keys}",
                    [*wp, *sp],
                )
            )
        if since is not None and day is not None and day * DAY_S > since:
            add(self._partial_day(keys, since, day * DAY_S, scope, sp))
        if self._core.has_rollups(since):
            table, window, wp = ("rollup_totals", "", []) if day is None else ("rollups", " AND day >= ?", [day])
            add(
                self._rows(
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

    def _family_window(self, keys: str, day: int, devices: Sequence[str] | None) -> list[tuple[Any, ...]]:
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
        return self._rows(
            f"SELECT {grouped}, {sums} FROM family_totals t LEFT JOIN family_tallies f ON f.device = t.device "
            f"AND f.day = :day - 1 AND f.family = t.family WHERE t.day >= :day - 1{scope.replace('?', ':devices')} "
            f"GROUP BY {grouped}",
            {"day": day, "devices": sp[0] if sp else None},
        )

    def _partial_day(self, keys: str, lo: float, hi: float, scope: str, sp: list[Any]) -> list[tuple[Any, ...]]:
        """``(keys..., executions, failures, seconds)`` of the rows that started in ``[lo, hi)``, over the
        time-led covering index; failures and retests are rare and come from their partial indexes. A retest is
        always one execution (only passing first attempts are folded together), so first-attempt executions =
        TOTAL(executions) - retests."""
        width = keys.count(",") + 1
        where, params = f"WHERE started_at >= ? AND started_at < ?{scope}", [lo, hi, *sp]
        groups: dict[tuple[Any, ...], list[float]] = {}
        for r in self._rows(
            f"SELECT {keys}, TOTAL(executions), TOTAL(duration_s) FROM results "
            f"INDEXED BY results_time {where} GROUP BY {keys}",
            params,
        ):
            groups[tuple(r[:width])] = [r[width], 0.0, r[width + 1]]
        for r in self._rows(
            f"SELECT {keys}, COUNT(*) FROM results INDEXED BY results_retests {where} AND attempt > 0 GROUP BY {keys}",
            params,
        ):
            groups[tuple(r[:width])][0] -= r[width]
        for r in self._rows(
            f"SELECT {keys}, COUNT(*) FROM results INDEXED BY results_failures {where} "
            f"AND passed = 0 AND attempt = 0 GROUP BY {keys}",
            params,
        ):
            groups[tuple(r[:width])][1] += r[width]
        return [(*key, n, k, secs) for key, (n, k, secs) in groups.items()]

    def scan_counts(
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
            for d, n in self._rows(
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
            for d, t in self._rows(
                "SELECT d.id, (SELECT COALESCE(s.finished_at, s.started_at) FROM scans s INDEXED BY scans_counted "
                "WHERE s.device = d.id AND "
                f"{COUNTED_SCAN} ORDER BY s.started_at DESC, s.id DESC LIMIT 1) AS t FROM devices d "
                f"WHERE true{one}",
                op,
            )
            if t is not None
        }
        if self._meta("rollup_last_day") is not None:
            day = first_day(since)
            if day is None:
                rolled = self._rows(f"SELECT device, complete FROM scan_rollup_totals WHERE true{dev}", dp)
            elif self._core.has_rollups(since):
                rolled = self._rows(
                    f"SELECT device, TOTAL(complete) FROM scan_rollups WHERE day >= ?{dev} GROUP BY device", [day, *dp]
                )
            else:
                rolled = []
            for d, n in rolled:
                complete[d] = complete.get(d, 0) + int(n)
            for d, t in self._rows(f"SELECT device, last_complete FROM scan_rollup_totals WHERE true{dev}", dp):
                if t is not None and (d not in last or t > last[d]):
                    last[d] = t
        return {d: ScanCounts(complete.get(d, 0), last.get(d)) for d in {*complete, *last}}
