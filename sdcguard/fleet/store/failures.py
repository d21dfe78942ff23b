"""Failed executions and what the circuit breaker weighs beside them (``store.failures``): failed first attempts
in a window, the devices that failed, and what the other devices did with the same cases (how many ran a case in a
time bucket, who passed it, every output it passed with).

Failures are rare: a partial index (``results_failures``) holds them, so none of these reads walks the passing rows
of a window; a device that failed on a pruned day is found in the roll-ups.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from .core import StoreCore, first_day, in_devices
from .rows import CaseCoverage, FailedExecution

__all__ = ["Failures"]


class Failures:
    """Failed executions and the breaker's view of the other devices.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def executions(self, *, since: float, devices: Sequence[str] | None = None) -> list[FailedExecution]:
        """Failed first attempts since ``since`` (failures are rare: a partial index holds them)."""
        scope, sp = in_devices(devices, "r.device")
        # No join: the scans' host is nobody's evidence, and a server planned the join as a hash of every scan of
        # the store (58 ms of the report's 82 ms for this query at 2,000 devices, growing with the fleet).
        rows = self._core.rows(
            "SELECT r.device, r.case_id, r.family, r.output_digest, r.sticky, r.started_at "
            "FROM results r INDEXED BY results_failures "
            f"WHERE r.passed = 0 AND r.attempt = 0 AND r.started_at >= ?{scope} ORDER BY r.started_at, r.id",
            [since, *sp],
        )
        return [
            FailedExecution(device=d, case=c, family=f, digest=g, sticky=None if s is None else bool(s), started_at=t)
            for d, c, f, g, s, t in rows
        ]

    def devices(self, *, since: float | None, devices: Sequence[str] | None = None) -> set[str]:
        """Devices with at least one failed first attempt since ``since`` (roll-ups included)."""
        scope, sp = in_devices(devices)
        window, wp = (" AND started_at >= ?", [since]) if since is not None else ("", [])
        found = {
            r[0]
            for r in self._core.rows(
                f"SELECT DISTINCT device FROM results INDEXED BY results_failures WHERE passed = 0 AND attempt = 0"
                f"{window}{scope}",
                [*wp, *sp],
            )
        }
        if self._core.has_rollups(since):
            day = first_day(since)
            table, window, wp = ("rollup_totals", "", []) if day is None else ("rollups", " AND day >= ?", [day])
            found |= {
                r[0]
                for r in self._core.rows(
                    f"SELECT DISTINCT device FROM {table} WHERE failures > 0{window}{scope}", [*wp, *sp]
                )
            }
        return found

    def most_failing(self, *, since: float, limit: int) -> list[str]:
        """Up to ``limit`` devices with failed first attempts since ``since``, most failures first."""
        return [
            r[0]
            for r in self._core.rows(
                "SELECT device, COUNT(*) AS n FROM results INDEXED BY results_failures "
                "WHERE passed = 0 AND attempt = 0 AND started_at >= ? GROUP BY device ORDER BY n DESC, device LIMIT ?",
                (since, limit),
            )
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
                rows = self._core.rows(f"SELECT device {where} LIMIT ?", (*params, 8 * cap))
                seen = len({r[0] for r in rows})
                if seen >= cap or len(rows) < 8 * cap:
                    devices = min(seen, cap)
            if devices is None:
                devices = int(self._core.one(f"SELECT COUNT(DISTINCT device) {where}", params) or 0)
                devices = devices if cap is None else min(devices, cap)
            if devices:
                out.append(CaseCoverage(case=case, bucket=b, devices=devices))
        return out

    def case_passers(self, cases: Iterable[str], *, since: float) -> dict[str, set[str]]:
        """The devices that passed each case (a first attempt) since ``since``."""
        names = sorted(set(cases))
        out: dict[str, set[str]] = {c: set() for c in names}
        if names:
            for case, device in self._core.rows(
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
            for case, digest in self._core.rows(
                "SELECT case_id, digest FROM pass_digests WHERE case_id IN (SELECT value FROM json_each(?))",
                (json.dumps(names),),
            ):
                out[case].add(digest)
        return out
