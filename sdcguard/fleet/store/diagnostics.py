"""The hardware's own opinions of itself, beside the golden suite's results and never mixed into them (neither is an
execution of a golden case: neither moves a rate). The report shows each device's latest; the policy counts them as
evidence only where told.

- ``store.diagnostics`` (:class:`Diagnostics`): DCGM's diagnostics (``sdcguard import dcgm``): one row per test and
  GPU of a ``dcgmi diag -j`` run (:mod:`sdcguard.fleet.dcgm`); evidence with ``[policy] dcgm_failures``.
- ``store.hardware`` (:class:`Hardware`): NVML's readings of each GPU around its scans, which the scanner keeps in
  the scan's meta (``telemetry_before``, ``telemetry_after``: :mod:`fleet_scan.devices.telemetry`), read back as
  :class:`~.rows.NvmlScan` records; evidence with ``[policy] nvml_errors`` (:mod:`sdcguard.fleet.nvml` tells which
  events are the hardware's). No table of their own: a scan's meta travels through spools and merges with it.
  Every reading is optional and a meta may hold anything: what is not a reading is left out, never an error.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

from .core import StoreCore, in_devices
from .rows import DiagRecord, DiagSummary, NvmlScan
from .scans import DRILL_SCAN
from .writes.results import ensure_device

__all__ = ["Diagnostics", "Hardware"]

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


_FINISHED = ("complete", "preempted", "interrupted", "error")
"""A scan's statuses once the scanner took its telemetry after it (a running scan has none yet)."""
_READ = f"meta LIKE '%\"telemetry_after\"%' AND NOT ({DRILL_SCAN})"
"""A scan whose telemetry after it was recorded (with the scan's end, in the write that moves the device's version),
a fire drill's never."""


class Hardware:
    """NVML's readings of each GPU around its scans, read back from the scans' meta (the module docstring). Only the
    meta of the scans asked about is read: one scan per GPU for :meth:`latest`, a window's for :meth:`events`.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def latest(self, devices: Sequence[str] | None = None) -> dict[str, NvmlScan]:
        """Each GPU's (of ``devices``, or every one) readings around its latest finished scan with telemetry after
        it, fire drills left out; a GPU whose latest such scan has no NVML reading has none."""
        scope, params = in_devices(devices, "d.id")
        # Per status, the device's latest such scan over the index (device, status, started_at): a few index
        # entries and table rows per GPU, whatever its history; the latest of the four is the one read.
        latest = ", ".join(
            f"(SELECT s.id FROM scans s INDEXED BY scans_device WHERE s.device = d.id AND s.status = '{status}' "
            f"AND {_READ} ORDER BY s.started_at DESC, s.id DESC LIMIT 1)"
            for status in _FINISHED
        )
        found = self._core.rows(f"SELECT {latest} FROM devices d WHERE d.kind = 'gpu'{scope}", params)
        ids = [int(i) for row in found for i in row if i is not None]
        if not ids:
            return {}
        best: dict[str, tuple[float, int]] = {}
        for i, device, t in self._core.rows(
            "SELECT id, device, started_at FROM scans WHERE id IN (SELECT CAST(value AS INTEGER) FROM json_each(?))",
            (json.dumps(ids),),
        ):
            best[device] = max(best.get(device, (float("-inf"), -1)), (float(t), int(i)))
        rows = self._scans([i for _, i in best.values()])
        return {r.device: r for r in rows}

    def events(self, *, since: float, devices: Sequence[str] | None = None) -> tuple[NvmlScan, ...]:
        """The finished scans of GPUs (of ``devices``, or every one) started since ``since`` that saw an XID (any:
        :mod:`sdcguard.fleet.nvml` tells the hardware's), a volatile double-bit ECC count or uncorrectable remapped
        rows that grew, or a failed row remapping; fire drills left out. Oldest first."""
        scope, params = in_devices(devices, "device")
        rows = self._core.rows(
            f"SELECT id, device, started_at, meta FROM scans WHERE status IN {_FINISHED} AND started_at >= ? "
            f"AND {_READ} AND device IN (SELECT id FROM devices WHERE kind = 'gpu'){scope} ORDER BY started_at, id",
            (since, *params),
        )
        found = (nvml_scan(int(i), d, float(t), m) for i, d, t, m in rows)
        return tuple(r for r in found if r is not None and _saw_event(r))

    def _scans(self, ids: Sequence[int]) -> list[NvmlScan]:
        rows = self._core.rows(
            "SELECT id, device, started_at, meta FROM scans WHERE id IN "
            "(SELECT CAST(value AS INTEGER) FROM json_each(?)) ORDER BY device",
            (json.dumps(list(ids)),),
        )
        return [r for i, d, t, m in rows if (r := nvml_scan(int(i), d, float(t), m)) is not None]


def _saw_event(r: NvmlScan) -> bool:
    return bool(r.xids or (r.dbe_growth or 0) > 0 or (r.uncorrectable_rows_growth or 0) > 0 or r.remap_failure)


_COUNTS = (
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
)
_FLAGS = ("remap_pending", "remap_failure")


def _count(value: Any) -> int | None:
    """A counter's reading: a whole number >= 0 (JSON may hold it as a float), anything else None."""
    if type(value) is int:  # not a bool, whose type is bool
        return value if value >= 0 else None
    if type(value) is float and math.isfinite(value) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _readings(snapshot: Any) -> dict[str, Any]:
    """The NVML readings of one telemetry snapshot: its counts, flags and XIDs, each only where it is one."""
    if type(snapshot) is not dict:
        return {}
    out: dict[str, Any] = {}
    for key in _COUNTS:
        if (n := _count(snapshot.get(key))) is not None:
            out[key] = n
    for key in _FLAGS:
        if type(flag := snapshot.get(key)) is bool:
            out[key] = flag
    if type(xids := snapshot.get("xids")) is list:
        out["xids"] = tuple(x for x in map(_count, xids) if x is not None)
    return out


def _growth(key: str, before: dict[str, Any], after: dict[str, Any]) -> int | None:
    """How much a counter grew from one snapshot to the other (a reset: none), None unless both read it."""
    b, a = before.get(key), after.get(key)
    return None if b is None or a is None else max(a - b, 0)


def nvml_scan(scan: int, device: str, time: float, meta: Any) -> NvmlScan | None:
    """The NVML readings a scan's meta (its JSON text) holds, or None when it holds none: a CPU core's telemetry,
    none at all, or anything that is not one (not JSON, not an object, readings that are not counts)."""
    try:
        doc = json.loads(meta) if isinstance(meta, str) else meta
    except (ValueError, RecursionError):  # not JSON (json's errors are ValueErrors)
        return None
    if type(doc) is not dict:
        return None
    before, after = _readings(doc.get("telemetry_before")), _readings(doc.get("telemetry_after"))
    if not before and not after:
        return None
    latest = {**before, **after}
    failed = before.get("remap_failure"), after.get("remap_failure")
    return NvmlScan(
        device=device,
        scan=scan,
        time=time,
        xids=latest.get("xids", ()),
        dbe_growth=_growth("ecc_dbe_volatile", before, after),
        uncorrectable_rows_growth=_growth("remapped_rows_uncorrectable", before, after),
        remap_failure=None if failed == (None, None) else any(failed),
        remap_pending=latest.get("remap_pending"),
        ecc_sbe_aggregate=latest.get("ecc_sbe_aggregate"),
        ecc_dbe_aggregate=latest.get("ecc_dbe_aggregate"),
        retired_pages_sbe=latest.get("retired_pages_sbe"),
        retired_pages_dbe=latest.get("retired_pages_dbe"),
        remapped_rows_correctable=latest.get("remapped_rows_correctable"),
        remapped_rows_uncorrectable=latest.get("remapped_rows_uncorrectable"),
    )
