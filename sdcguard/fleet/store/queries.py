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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from ...durations import DAY_S, DEFAULT_WINDOW_S
from ...records import Incident
from .case_queries import CaseQueries
from .core import in_devices
from .rows import CaseCoverage, Decision, DeviceStatus, FailedExecution, QuarantineEntry, SeriesPoint, device_status
from .schema.tables import COUNTED_SCAN
from .tally_queries import TallyQueries, first_day

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
    def failed_executions(self, *, since: float, devices: Sequence[str] | None = None) -> list[FailedExecution]:
        """Failed first attempts since ``since`` (failures are rare: a partial index holds them)."""
        scope, sp = in_devices(devices, "r.device")
        # No join: the scans' host is nobody's evidence, and a server planned the join as a hash of every scan of
        # the store (58 ms of the report's 82 ms for this query at 2,000 devices, growing with the fleet).
        rows = self._rows(
            "SELECT r.device, r.case_id, r.family, r.output_digest, r.sticky, r.started_at "
            "FROM results r INDEXED BY results_failures "
            f"WHERE r.passed = 0 AND r.attempt = 0 AND r.started_at >= ?{scope} ORDER BY r.started_at, r.id",
            [since, *sp],
        )
        return [
            FailedExecution(device=d, case=c, family=f, digest=g, sticky=None if s is None else bool(s), started_at=t)
            for d, c, f, g, s, t in rows
        ]

    def case_coverage(
        self,
        buckets: Iterable[tuple[str, int]],
        *,
        since: float,
        bucket_s: float,
        enough: Mapping[tuple[str, int], int] | None = None,
    ) -> list[CaseCoverage]:
        """How many distinct devices ran each case since ``since`` in each of ``buckets`` (pairs of a case and
        ``int(started_at // bucket_s)``): the breaker asks only for the buckets its failures fell in, so a report
        over 30 days reads the executions of those buckets, not of the window. Each pair is one range of the
        ``results_cases`` index, a little wider than the bucket (by far more than a division's rounding), so that
        the SQL's own bucket arithmetic decides membership, as it always has.

        ``enough``: for a pair in it, counting stops at that many devices: its answer is ``min(devices, enough)``.
        Proof: the first ``8 * enough`` rows of the pair's range (in index order) are read; if they hold ``enough``
        devices, the pair has at least that many; if they are fewer than asked for, they are all its rows and
        their devices are its devices; otherwise the devices are counted whole. A breaker that only needs to know
        whether a share is exceeded reads a few rows per bucket instead of every device's (at 10,000 devices a
        30-day report asked for 141 buckets of 10,000 devices each: 0.87 s)."""
        out: list[CaseCoverage] = []
        where = (
            "FROM results INDEXED BY results_cases WHERE case_id = ? AND started_at >= ? AND started_at < ? "
            "AND CAST(started_at / ? AS INTEGER) = ?"
        )
        for case, b in sorted(set(buckets)):
            margin = 1e-9 * (abs(b) + 2) * bucket_s
            params = (case, max(since, b * bucket_s - margin), (b + 1) * bucket_s + margin, bucket_s, b)
            cap = None if enough is None else enough.get((case, b))
            devices = None
            if cap is not None:
                rows = self._rows(f"SELECT device {where} LIMIT ?", (*params, 8 * cap))
                seen = len({r[0] for r in rows})
                if seen >= cap or len(rows) < 8 * cap:
                    devices = min(seen, cap)
            if devices is None:
                devices = int(self._one(f"SELECT COUNT(DISTINCT device) {where}", params) or 0)
                devices = devices if cap is None else min(devices, cap)
            if devices:
                out.append(CaseCoverage(case=case, bucket=b, devices=devices))
        return out

    def case_passers(self, cases: Iterable[str], *, since: float) -> dict[str, set[str]]:
        """The devices that passed each case (a first attempt) since ``since``."""
        names = sorted(set(cases))
        out: dict[str, set[str]] = {c: set() for c in names}
        if names:
            for case, device in self._rows(
                "SELECT DISTINCT case_id, device FROM results INDEXED BY results_cases "
                "WHERE case_id IN (SELECT value FROM json_each(?)) AND started_at >= ? AND passed = 1 AND attempt = 0",
                (json.dumps(names), since),
            ):
                out[case].add(device)
        return out

    def pass_digests(self, cases: Iterable[str]) -> dict[str, set[str]]:
        """Every output digest each case passed with (one per golden file that was in use)."""
        names = sorted(set(cases))
        out: dict[str, set[str]] = {c: set() for c in names}
        if names:
            for case, digest in self._rows(
                "SELECT case_id, digest FROM pass_digests WHERE case_id IN (SELECT value FROM json_each(?))",
                (json.dumps(names),),
            ):
                out[case].add(digest)
        return out

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
    def failing_devices(self, *, since: float | None, devices: Sequence[str] | None = None) -> set[str]:
        """Devices with at least one failed first attempt since ``since`` (roll-ups included)."""
        scope, sp = in_devices(devices)
        window, wp = (" AND started_at >= ?", [since]) if since is not None else ("", [])
        found = {
            r[0]
            for r in self._rows(
                f"SELECT DISTINCT device FROM results INDEXED BY results_failures WHERE passed = 0 AND attempt = 0"
                f"{window}{scope}",
                [*wp, *sp],
            )
        }
        if self._has_rollups(since):
            day = first_day(since)
            table, window, wp = ("rollup_totals", "", []) if day is None else ("rollups", " AND day >= ?", [day])
            found |= {
                r[0]
                for r in self._rows(
                    f"SELECT DISTINCT device FROM {table} WHERE failures > 0{window}{scope}", [*wp, *sp]
                )
            }
        return found

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
            failing = self.failing_devices(since=suspect_since, devices=devices)
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

    def most_failing(self, *, since: float, limit: int) -> list[str]:
        """Up to ``limit`` devices with failed first attempts since ``since``, most failures first."""
        return [
            r[0]
            for r in self._rows(
                "SELECT device, COUNT(*) AS n FROM results INDEXED BY results_failures "
                "WHERE passed = 0 AND attempt = 0 AND started_at >= ? GROUP BY device ORDER BY n DESC, device LIMIT ?",
                (since, limit),
            )
        ]

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
        if self._has_rollups(start):
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
