"""The per-device report: what ``sdcguard report`` prints and the Prometheus export publishes.

One row per known device: rates over the window (overall and per kernel family, see :mod:`sdcguard.fleet.rates`),
complete scans in the window, the last complete scan, and the status:

- ``quarantined``: out of service (the policy or an operator put it there);
- ``probation``: released by hand, back in service, watched until enough clean scans;
- ``suspect``: neither of those, but at least one failed execution in the window;
- ``healthy``: everything else, including a device with no execution in the window.

Beside the status, ``slow``: whether the device takes clearly longer than its peers of the same model for the same
golden cases (:mod:`..slow`); a slow device computes right answers and can be healthy.

Every figure comes from the store's named queries (a few ``GROUP BY`` each); no Python loop walks result rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...devices import unknown_device
from ...durations import iso_utc
from ...records import DeviceInfo
from ..breaker import BreakerSettings, suite_blamed_devices
from ..nvml import HARDWARE_XIDS, nvml_text
from ..policy.settings import QuarantinePolicy
from ..rates import Rate, clopper_pearson, device_rates
from ..slow import Slowness, SlowSettings
from ..slow_fleet import fleet_slowness
from ..store.rows import DeviceStatus, DiagSummary, NvmlScan, ScanCounts
from ..store.store import Store

__all__ = [
    "DeviceReport",
    "build_report",
    "report_json",
    "report_csv_rows",
    "REPORT_FIELDS",
    "STATUS_ORDER",
    "dcgm_text",
    "nvml_json",
]

STATUS_ORDER: tuple[DeviceStatus, ...] = ("quarantined", "probation", "suspect", "healthy")
"""The report's order: quarantined devices first, healthy ones last (then by failures, most first, and id)."""

REPORT_FIELDS = (
    "device",
    "host",
    "kind",
    "model",
    "index",
    "executions",
    "failures",
    "rate",
    "rate_low",
    "rate_high",
    "confidence",
    "test_hours",
    "failures_per_test_hour",
    "scans",
    "status",
    "last_scan",
    "slow",
    "slowdown",
    "slowdown_low",
    "slow_basis",
    "slow_confidence",
    "slow_judged_at",
    "dcgm",
    "nvml",
)
"""The flat fields of a report row, in CSV column order (JSON adds ``families`` when asked for; ``nvml`` is an object
there, its ``text`` in CSV)."""


@dataclass(kw_only=True, slots=True)
class DeviceReport:
    """One device's line of the report. A value: treat it as read-only (not ``frozen``, as
    :class:`~..rates.Rate`: one per device, and frozen dataclasses take twice as long to construct)."""

    device: str
    host: str
    kind: str
    model: str | None
    index: int | None
    overall: Rate
    families: dict[str, Rate] | None = None
    """Per kernel family, when the report was built with ``families=True``."""
    confidence: float
    scans: int
    """Complete scans started in the window."""
    status: DeviceStatus
    last_scan: float | None
    """Unix time the device's latest complete scan finished (ever), None if never."""
    slowness: Slowness | None = None
    """Whether it is slower than its peers on the same golden cases (beside ``status``: a slow device can be
    healthy; :mod:`..slow`)."""
    dcgm: DiagSummary | None = None
    """Its latest DCGM diagnostic (``sdcguard import dcgm``), a second opinion beside the golden suite's."""
    nvml: NvmlScan | None = None
    """NVML's readings around its latest scan (a GPU's: ``store.hardware``), another second opinion."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of this row (``last_scan`` as ISO 8601 UTC)."""
        o = self.overall
        return {
            "device": self.device,
            "host": self.host,
            "kind": self.kind,
            "model": self.model,
            "index": self.index,
            "executions": o.executions,
            "failures": o.failures,
            "rate": o.rate,
            "rate_low": o.rate_low,
            "rate_high": o.rate_high,
            "confidence": self.confidence,
            "test_hours": o.test_hours,
            "failures_per_test_hour": o.failures_per_test_hour,
            "scans": self.scans,
            "status": self.status,
            "last_scan": iso_utc(self.last_scan),
            **(self.slowness.as_dict() if self.slowness is not None else _NOT_JUDGED),
            "dcgm": dcgm_text(self.dcgm),
            "nvml": nvml_json(self.nvml),
            **(
                {
                    "families": {
                        name: {**r.as_dict(), **self._family_slow(name)} for name, r in sorted(self.families.items())
                    }
                }
                if self.families is not None
                else {}
            ),
        }

    def _family_slow(self, family: str) -> dict[str, Any]:
        """A family's ``slowdown`` (None where it was not compared) and ``slow`` (the device's verdict, shown on the
        family that is over the threshold)."""
        s = self.slowness
        x = s.families.get(family) if s is not None else None
        return {
            "slow": bool(s and s.slow and x is not None and x > 1 + s.threshold),
            "slowdown": x,
            "slowdown_low": None,
            "slow_basis": s.basis if s and x is not None else "none",
            "slow_confidence": None,
        }


def dcgm_text(d: DiagSummary | None) -> str | None:
    """``pass``, ``warn``, ``skip``, or ``fail: memory, pcie`` (the failed tests); None: never diagnosed."""
    if d is None:
        return None
    return f"fail: {', '.join(d.failed)}" if d.status == "fail" else d.status


def nvml_json(r: NvmlScan | None) -> dict[str, Any] | None:
    """The ``nvml`` object of a GPU's row: the text of its cell (:func:`~..nvml.nvml_text`), when its latest scan
    with NVML telemetry started, the XIDs seen during it (``hardware_xids``: those that count), what grew during it,
    and the latest readings (null where the GPU gave none); None: no NVML reading."""
    if r is None:
        return None
    return {
        "text": nvml_text(r),
        "scan_started": iso_utc(r.time),
        "xids": list(r.xids),
        "hardware_xids": [x for x in r.xids if x in HARDWARE_XIDS],
        "dbe_growth": r.dbe_growth,
        "uncorrectable_rows_growth": r.uncorrectable_rows_growth,
        "remap_failure": r.remap_failure,
        "remap_pending": r.remap_pending,
        "ecc_sbe_aggregate": r.ecc_sbe_aggregate,
        "ecc_dbe_aggregate": r.ecc_dbe_aggregate,
        "retired_pages_sbe": r.retired_pages_sbe,
        "retired_pages_dbe": r.retired_pages_dbe,
        "remapped_rows_correctable": r.remapped_rows_correctable,
        "remapped_rows_uncorrectable": r.remapped_rows_uncorrectable,
    }


_NOT_JUDGED = Slowness(device="", slow=False).as_dict()
"""The ``slow*`` fields of a device without a verdict (one dict for every such row: ``as_dict`` copies it)."""


def _local_index(device: str, kind: str) -> int | None:
    """A CPU core's or simulated device's number, from its id (``cpu:<host>:<core>``, ``sim:<n>``: the store holds
    only ids :func:`~...devices.parse_device_id` accepted); None for a GPU, whose index the store keeps."""
    if kind not in ("cpu", "sim"):
        return None
    local = device.rpartition(":")[2]
    return int(local) if local.isdecimal() else None


def _known(store: Store, device: str) -> DeviceInfo:
    one = store.scans.device(device)
    if one is None:
        raise unknown_device(
            device, [d.id for d in store.scans.devices()], what=f"no report of {device} in {store.path}"
        )
    return one


def build_report(
    store: Store,
    *,
    since: float | None,
    device: str | None = None,
    devices: Sequence[str] | None = None,
    confidence: float = 0.95,
    suspect_since: float | None = None,
    families: bool = False,
    slow: SlowSettings | None = None,
    breaker: BreakerSettings | None = None,
    now: float | None = None,
    slow_max_age_s: float = 0.0,
) -> list[DeviceReport]:
    """The report rows, ordered quarantined first, then by failures (most first) and device id.

    ``since``: start of the window (None: all time). ``suspect_since``: start of the window in which a failure
    makes a device ``suspect`` (default: ``since``). ``device``: only this one (unknown: :class:`BadInput`);
    ``devices``: only those of these the store knows. ``families``: add the per-family rates to each row.
    ``slow``: the slowness rule's settings (default: the policy's defaults). ``breaker``: the circuit breaker's
    settings (default: the policy's): a device whose every failure in the window the breaker blames on the suite
    or the software is not ``suspect`` (its failures still count in its rate). ``slow_max_age_s``: use slowness
    verdicts kept up to this long before ``now`` (default: the clock) instead of computing them (0: compute;
    :func:`~..slow_fleet.fleet_slowness`)."""
    t = time.time() if now is None else now
    known = [_known(store, device)] if device is not None else store.scans.devices(devices)
    wanted = [d.id for d in known] if device is not None or devices is not None else None
    rates = device_rates(store, since=since, devices=wanted, confidence=confidence, by_family=families)
    scans = store.counts.scans(since=since, devices=wanted)
    suspect_start = suspect_since if suspect_since is not None else since
    if suspect_since is None or suspect_since == since:
        failing = {d for d, r in rates.items() if r.overall.failures > 0}
        counted = {d: r.overall.failures for d, r in rates.items()}
    else:
        failing = store.failures.devices(since=suspect_start, devices=[d.id for d in known])
        counted = {}
    if failing:
        blamed = suite_blamed_devices(store.failures, breaker or QuarantinePolicy(), since=suspect_start or 0.0, now=t)
        # Cleared only when the rows hold every failure the rates count (none sits in a pruned day's roll-up).
        failing -= {d for d, n in blamed.items() if counted.get(d, n) == n}
    statuses = store.quarantine.statuses(suspect_since=suspect_start, devices=[d.id for d in known], failing=failing)
    slowness = fleet_slowness(
        store,
        since=suspect_start,
        settings=slow,
        devices=[d.id for d in known],
        known=known if wanted is None else None,
        now=t,
        max_age_s=slow_max_age_s,
    )
    diagnosed = store.diagnostics.latest(wanted)
    hardware = store.hardware.latest(wanted)
    lo0, hi0 = clopper_pearson(0, 0, confidence)
    empty = Rate(executions=0, failures=0, rate=0.0, rate_low=lo0, rate_high=hi0, test_hours=0.0)
    none = ScanCounts(0, None)
    rows = []
    for d in known:
        r = rates.get(d.id)
        counts = scans.get(d.id, none)
        rows.append(
            DeviceReport(
                device=d.id,
                host=d.host,
                kind=d.kind,
                model=d.model,
                index=d.index if d.index is not None else _local_index(d.id, d.kind),
                overall=r.overall if r else empty,
                families=(dict(r.families) if r else {}) if families else None,
                confidence=confidence,
                scans=counts.complete,
                status=statuses[d.id],
                last_scan=counts.last_complete,
                slowness=slowness.get(d.id),
                dcgm=diagnosed.get(d.id),
                nvml=hardware.get(d.id),
            )
        )
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    rows.sort(key=lambda x: (order[x.status], -x.overall.failures, x.device))
    return rows


def report_json(rows: list[DeviceReport]) -> str:
    """The ``--format json`` text: a list of objects."""
    return json.dumps([r.as_dict() for r in rows])  # no indent: the C encoder, 10x faster


def report_csv_rows(rows: Sequence[DeviceReport | Mapping[str, Any]]) -> list[list[Any]]:
    """The CSV of a report (its rows, or their JSON objects), header first: :data:`REPORT_FIELDS`; a report built
    with ``families=True`` adds a ``family`` column, ``all`` on each device's overall row, followed by one row per
    kernel family (the family's figures, the device's other fields)."""
    dicts = [r.as_dict() if isinstance(r, DeviceReport) else r for r in rows]
    with_families = any("families" in d for d in dicts)
    out: list[list[Any]] = [[*REPORT_FIELDS, *(["family"] if with_families else [])]]
    for d in dicts:
        out.append([_csv_cell(d[f]) for f in REPORT_FIELDS] + (["all"] if with_families else []))
        for name in sorted(d.get("families", {})):
            fam = {**d, **d["families"][name]}
            out.append([_csv_cell(fam[f]) for f in REPORT_FIELDS] + [name])
    return out


def _csv_cell(value: Any) -> Any:
    """A field as the JSON report spells it: ``true``/``false`` (not Python's ``True``), empty for null."""
    if value is None:
        return ""
    if isinstance(value, dict):  # nvml: its text
        return value.get("text") or ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value
