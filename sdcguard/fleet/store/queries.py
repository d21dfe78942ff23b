"""The store's named read queries: what rates, the policy, the report and the plots ask, returning records.

Which executions count: every recorded first attempt (``attempt = 0``) of a golden case, whatever became of its
scan (a scanner killed mid-scan must not hide the failures it already found); a retest is run *because* a case
failed and would bias the rate, so it counts in testing time only. A row may stand for many passing executions
(``executions``); a failed execution is always one row.

Windows: a row counts when it started at or after ``since`` (a passing row: its first execution). Scans older
than the retention horizon (``sdcguard prune``) live as per-day roll-ups; a rolled-up day counts when it starts
at or after ``since``, so beyond the horizon a window's start is resolved to the UTC day.

Counts over whole UTC days come from tallies, never from rows: ``day_tallies`` for the days still held as rows
(kept exact as rows are written, merged and pruned: :mod:`.maintenance`), the roll-ups for pruned days. Rows
are read only for the partial first day of a window, over the time-led covering index ``results_time``;
failures and retests are rare and come from partial indexes, so no per-row expression is evaluated over
millions of rows. The slowness statistic's times per device and case come the same way from the case tallies
(running totals: two rows per device and case whatever the window, :meth:`StoreQueries.case_times`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ...durations import DAY_S, DEFAULT_WINDOW_S
from ...records import Incident
from .case_queries import CaseQueries
from .core import first_day, in_devices
from .rows import Decision, DeviceStatus, QuarantineEntry, SeriesPoint, device_status
from .schema.tables import COUNTED_SCAN
from .tally_queries import TallyQueries

__all__ = ["StoreQueries"]
_INCIDENT_FIELDS = frozenset(Incident.__dataclass_fields__)
_TUPLE_FIELDS = ("suspect_ranks", "devices", "hosts")


class StoreQueries(CaseQueries, TallyQueries):
    """Named read queries of the fleet store (part of :class:`sdcguard.fleet.store.store.Store`)."""

    def row_count(self, table: Literal["results", "scans", "devices", "incidents", "rollups"]) -> int:
        """``SELECT COUNT(*)`` of one table: the floor every aggregation is measured against."""
        if table not in ("results", "scans", "devices", "incidents", "rollups"):
            raise ValueError(f"no table {table!r}")
        return int(self._one(f"SELECT COUNT(*) FROM {table}"))

    # ------------------------------------------------------------------ what the policy weighs
    def clean_scans_since(self, since: Mapping[str, float]) -> dict[str, int]:
        """For each device, its complete scans without a failure that started at or after its own time (a scan
        that executed nothing is not one: :data:`~.schema.tables.COUNTED_SCAN`)."""
        if not since:
            return {}
        rows = self._rows(
            "SELECT s.device, COUNT(*) FROM scans s JOIN json_each(?) j ON j.key = s.device "
            f"WHERE s.started_at >= CAST(j.value AS REAL) AND {COUNTED_SCAN} AND s.failures = 0 GROUP BY s.device",
            (json.dumps(dict(since)),),
        )
        return {d: int(n) for d, n in rows}

    # ------------------------------------------------------------------ status and scans
    def quarantine_states(self) -> dict[str, str]:
        """``device -> "quarantined" | "probation"`` for every device with a quarantine row."""
        return {d: s for d, s in self._rows("SELECT device, state FROM quarantine")}

    def statuses(
        self, *, suspect_since: float | None, devices: Sequence[str] | None = None, failing: set[str] | None = None
    ) -> dict[str, DeviceStatus]:
        """The status of every known device (or of ``devices``), by :func:`device_status`.

        ``failing``: the devices that failed in the window, when the caller already knows them (the report
        computed them with the rates); else they are read here.
        """
        states = self.quarantine_states()
        if failing is None:
            failing = self.failures.devices(since=suspect_since, devices=devices)
        named = self.training.suspects(since=suspect_since)
        ids = list(devices) if devices is not None else [r[0] for r in self._rows("SELECT id FROM devices")]
        return {d: device_status(states.get(d), d in failing or d in named) for d in ids}

    def quarantine_status(
        self, device: str, *, window_s: float = DEFAULT_WINDOW_S, now: float | None = None
    ) -> DeviceStatus:
        """One device's status (see :func:`sdcguard.fleet.store.rows.device_status`); suspect over ``window_s``."""
        import time

        t = time.time() if now is None else now
        return self.statuses(suspect_since=t - window_s, devices=[device])[device]

    # ------------------------------------------------------------------ quarantine
    def quarantine_list(self) -> list[QuarantineEntry]:
        """Devices quarantined or on probation, oldest first."""
        rows = self._rows(
            "SELECT q.device, q.state, q.since, q.reason, q.by, d.host FROM quarantine q "
            "LEFT JOIN devices d ON d.id = q.device ORDER BY q.since, q.device"
        )
        return [QuarantineEntry(device=r[0], state=r[1], since=r[2], reason=r[3], by=r[4], host=r[5]) for r in rows]

    def quarantine_history(self, device: str | None = None) -> list[dict[str, Any]]:
        """Every quarantine change (who, when, why, action), oldest first."""
        where, params = ("WHERE device = ?", (device,)) if device else ("", ())
        return self._dicts(
            f"SELECT device, action, time, by, reason FROM quarantine_history {where} ORDER BY time, id", params
        )

    def decisions(self, *, since: float | None = None) -> list[Decision]:
        """What the policy decided and why, oldest first."""
        rows = self._rows(
            "SELECT device, decision, reason, time FROM policy_decisions WHERE time >= ? ORDER BY time, id",
            (since if since is not None else float("-inf"),),
        )
        return [Decision(device=d, decision=k, reason=r, time=t) for d, k, r, t in rows]

    # ------------------------------------------------------------------ plots
    def first_execution_time(self) -> float | None:
        """When the oldest recorded execution started (roll-ups included), None for an empty store."""
        t = self._one("SELECT MIN(started_at) FROM results")
        day = self._one("SELECT MIN(day) FROM rollups") if self._meta("rollup_last_day") is not None else None
        candidates = [x for x in (t, None if day is None else day * DAY_S) if x is not None]
        return min(candidates) if candidates else None

    def rate_series(self, *, start: float, width_s: float, devices: Sequence[str] | None) -> list[SeriesPoint]:
        """Executions and failures per ``width_s`` bin from ``start``, per device (``devices``) or for the fleet
        (None); a rolled-up day falls in the bin of its start."""
        per_device = devices is not None
        keys = "device, b" if per_device else "b"
        scope, sp = in_devices(devices)
        sums: dict[tuple[str | None, int], list[int]] = {}
        for r in self._rows(
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
            for r in self._rows(
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
