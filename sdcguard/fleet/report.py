"""The per-device report: what ``sdcguard report`` prints and the Prometheus export publishes.

One row per known device: rates over the window (overall and per kernel family, see :mod:`sdcguard.rates`),
complete scans in the window, the last complete scan, and the status:

- ``quarantined``: out of service (the policy or an operator put it there);
- ``probation``: released by hand, back in service, watched until enough clean scans;
- ``suspect``: neither of those, but at least one failed execution in the window;
- ``healthy``: everything else, including a device with no execution in the window.

Every figure comes from a few ``GROUP BY`` queries; no Python loop ever walks result rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..devices import parse_device_id
from ..durations import iso_utc
from ..errors import BadInput
from .rates import Rate, clopper_pearson, device_rates
from .store import DeviceStatus, Store

__all__ = ["DeviceReport", "build_report", "REPORT_FIELDS"]

REPORT_FIELDS = (
    "device", "host", "kind", "model", "index", "executions", "failures", "rate", "rate_low", "rate_high",
    "confidence", "test_hours", "failures_per_test_hour", "scans", "status", "last_scan",
)
"""The flat fields of a report row, in CSV column order (JSON adds ``families`` when asked for)."""


@dataclass(frozen=True, kw_only=True)
class DeviceReport:
    """One device's line of the report."""

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

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of this row (``last_scan`` as ISO 8601 UTC)."""
        o = self.overall
        return {
            "device": self.device, "host": self.host, "kind": self.kind, "model": self.model, "index": self.index,
            "executions": o.executions, "failures": o.failures, "rate": o.rate, "rate_low": o.rate_low,
            "rate_high": o.rate_high, "confidence": self.confidence, "test_hours": o.test_hours,
            "failures_per_test_hour": o.failures_per_test_hour, "scans": self.scans, "status": self.status,
            "last_scan": iso_utc(self.last_scan),
            **(
                {"families": {name: r.as_dict() for name, r in sorted(self.families.items())}}
                if self.families is not None else {}
            ),
        }


def _local_index(device: str) -> int | None:
    try:
        kind, _, local = parse_device_id(device)
    except BadInput:
        return None
    return int(local) if kind in ("cpu", "sim") else None


def build_report(
    store: Store, *, since: float | None, device: str | None = None, confidence: float = 0.95,
    suspect_since: float | None = None, families: bool = False,
) -> list[DeviceReport]:
    """The report rows, ordered quarantined first, then by failures (most first) and device id.

    ``since``: start of the window (None: all time). ``suspect_since``: start of the window in which a failure
    makes a device ``suspect`` (default: ``since``). ``families``: add the per-family rates to each row.
    """
    if device is not None:
        known = store.scalar("SELECT 1 FROM devices WHERE id = ?", (device,))
        if not known:
            raise BadInput(f"no device {device!r} in {store.path}; `sdcguard report` lists the known devices")
    where, params = ("WHERE id = ?", [device]) if device else ("", [])
    devices = store.query(f"SELECT id, host, kind, model, idx FROM devices {where} ORDER BY id", params)
    rates = device_rates(
        store, since=since, devices=[device] if device else None, confidence=confidence, by_family=families
    )
    dev_clause, dev_params = ("AND device = ?", [device]) if device else ("", [])
    win_clause, win_params = ("AND started_at >= ?", [since]) if since is not None else ("", [])
    scans = dict(
        store._conn.execute(
            f"SELECT device, COUNT(*) FROM scans WHERE status = 'complete' {win_clause} {dev_clause} GROUP BY device",
            [*win_params, *dev_params],
        ).fetchall()
    )
    last = dict(
        store._conn.execute(
            f"SELECT device, MAX(COALESCE(finished_at, started_at)) FROM scans WHERE status = 'complete' {dev_clause} "
            "GROUP BY device",
            dev_params,
        ).fetchall()
    )
    states = dict(store._conn.execute("SELECT device, state FROM quarantine").fetchall())
    if suspect_since is None or suspect_since == since:
        failing = {d for d, r in rates.items() if r.overall.failures > 0}
    else:
        failing = {
            r[0]
            for r in store._conn.execute(
                f"SELECT DISTINCT device FROM results WHERE passed = 0 AND started_at >= ? {dev_clause}",
                [suspect_since, *dev_params],
            )
        }
    lo0, hi0 = clopper_pearson(0, 0, confidence)
    empty = Rate(executions=0, failures=0, rate=0.0, rate_low=lo0, rate_high=hi0, test_hours=0.0)
    rows = []
    for d in devices:
        r = rates.get(d["id"])
        status: DeviceStatus = states.get(d["id"]) or ("suspect" if d["id"] in failing else "healthy")
        rows.append(
            DeviceReport(
                device=d["id"], host=d["host"], kind=d["kind"], model=d["model"],
                index=d["idx"] if d["idx"] is not None else _local_index(d["id"]),
                overall=r.overall if r else empty, families=(dict(r.families) if r else {}) if families else None, confidence=confidence,
                scans=int(scans.get(d["id"], 0)), status=status, last_scan=last.get(d["id"]),
            )
        )
    order = {"quarantined": 0, "probation": 1, "suspect": 2, "healthy": 3}
    rows.sort(key=lambda x: (order[x.status], -x.overall.failures, x.device))
    return rows


def report_json(rows: list[DeviceReport]) -> str:
    """The ``--format json`` text: a list of objects."""
    return json.dumps([r.as_dict() for r in rows])  # no indent: the C encoder, 10x faster
