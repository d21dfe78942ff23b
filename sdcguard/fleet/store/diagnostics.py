"""``store.diagnostics``: DCGM's diagnostics as a second opinion on each GPU (``sdcguard import dcgm``): one row per
test and GPU of a ``dcgmi diag -j`` run (:mod:`sdcguard.fleet.dcgm`), beside the golden suite's results, never
mixed into them (a DCGM test is no execution of a golden case: it moves no rate). The report shows each device's
latest run; the policy counts a failed diagnostic as evidence only where told (``[policy] dcgm_failures``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from .core import StoreCore, in_devices
from .rows import DiagRecord, DiagSummary
from .writes.results import ensure_device

__all__ = ["Diagnostics"]

_WORST = ("fail", "warn", "pass", "skip")
"""A run's status on a device: the worst of its tests' (a skipped test says nothing)."""


class Diagnostics:
    """The DCGM diagnostics the store holds, per GPU.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def record(
        self,
        results: Sequence[DiagRecord],
        *,
        host: str,
        time: float,
        run_id: str,
        dcgm_version: str | None = None,
        driver: str | None = None,
    ) -> int:
        """Record one diagnostic run's results (each already named by its device); returns the rows written.
        Recording the same run (``run_id``) again writes nothing."""
        rows = []
        for r in results:
            key = hashlib.sha256(f"{run_id}\0{r.device}\0{r.category}\0{r.test}".encode()).hexdigest()
            rows.append((key, r.device, host, run_id, time, r.category, r.test, r.status, json.dumps(list(r.warnings))))
        with self._core.write() as conn:
            self._core.lock_devices({row[1] for row in rows})
            for device in sorted({row[1] for row in rows}):
                ensure_device(conn, device, host, time)
            before = int(self._core.one("SELECT COUNT(*) FROM dcgm_results"))
            for row in rows:
                conn.execute(
                    "INSERT INTO dcgm_results(uuid, device, host, run, time, category, test, status, warnings, "
                    "dcgm_version, driver) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(uuid) DO NOTHING",
                    (*row, dcgm_version, driver),
                )
            return int(self._core.one("SELECT COUNT(*) FROM dcgm_results")) - before

    def latest(self, devices: Sequence[str] | None = None) -> dict[str, DiagSummary]:
        """Each device's latest diagnostic run (of ``devices``, or every device with one)."""
        scope, params = in_devices(devices, "d.device")
        rows = self._core.rows(
            "SELECT d.device, d.run, d.time, d.test, d.status FROM dcgm_results d JOIN (SELECT device, MAX(time) AS "
            f"t FROM dcgm_results GROUP BY device) m ON m.device = d.device AND m.t = d.time WHERE true{scope} "
            "ORDER BY d.device, d.test",
            params,
        )
        runs: dict[str, list[tuple[str, float, str, str]]] = {}
        for device, run, t, test, status in rows:
            runs.setdefault(device, []).append((run, float(t), test, status))
        return {device: _summary(device, tests) for device, tests in runs.items()}

    def failed(self, *, since: float | None) -> dict[str, DiagSummary]:
        """The devices whose latest run since ``since`` failed a test."""
        return {d: s for d, s in self.latest().items() if s.status == "fail" and (since is None or s.time >= since)}


def _summary(device: str, tests: list[tuple[str, float, str, str]]) -> DiagSummary:
    statuses = {status for *_, status in tests}
    worst = next(s for s in _WORST if s in statuses)
    return DiagSummary(
        device=device,
        run=tests[0][0],
        time=tests[0][1],
        status=worst,  # type: ignore[arg-type]
        failed=tuple(test for _, _, test, status in tests if status == "fail"),
        tests=len(tests),
    )
