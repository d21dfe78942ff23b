"""Shared helpers for the fleet-store tests: results, filled stores, file snapshots."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from sdcguard.fleet.store.store import Store
from sdcguard.records import CaseResult, DeviceInfo, ScanStatus

NOW = 1_800_000_000.0
"""A fixed 'now' (2027-01-15) so windows are deterministic."""


def result(
    device: str,
    *,
    passed: bool = True,
    case: str = "gemm.fp32.n64",
    family: str = "gemm",
    t: float = NOW - 3600,
    digest: str | None = None,
    attempt: int = 0,
    sticky: bool | None = None,
    duration_s: float = 0.5,
) -> CaseResult:
    return CaseResult(
        device=device,
        case=case,
        family=family,
        seed=7,
        passed=passed,
        duration_s=duration_s,
        started_at=t,
        output_digest=(
            digest if digest is not None else None if passed else hashlib.sha256(device.encode()).hexdigest()
        ),
        mismatches=0 if passed else 1,
        element=None if passed else 3,
        expected=None if passed else "0x3f800000",
        actual=None if passed else "0x3f800001",
        xor_mask=None if passed else "0x1",
        attempt=attempt,
        sticky=sticky,
    )


def scan(
    store: Store,
    device: str,
    results: Sequence[CaseResult],
    *,
    host: str = "node1",
    finish: str | None = "complete",
    t: float = NOW - 3600,
) -> int:
    store.scans.record_devices(
        [DeviceInfo(id=device, host=host, kind=device.split(":")[0] if ":" in device else "gpu")], now=t
    )
    sid = store.scans.begin(device=device, host=host, budget_s=60.0, started_at=t)
    store.scans.record(sid, results, finish=finish, finished_at=t + 60)
    return sid


def clean(device: str, n: int, *, t: float = NOW - 3600, family: str = "gemm") -> list[CaseResult]:
    return [result(device, t=t + i, family=family) for i in range(n)]


def snapshot(path: Path) -> tuple[bytes, int]:
    """Bytes and mtime of a file, to prove a command left it untouched."""
    return path.read_bytes(), os.stat(path).st_mtime_ns


def query(db: str | Path, sql: str, params: Sequence[object] = ()) -> list[tuple]:
    """The rows of one statement of the store's SQL text, read straight from a store on either backend (a SQLite
    file, or a ``postgresql://`` URL: the text as :func:`~sdcguard.fleet.store.postgres.dialect.to_postgres` spells
    it), without the store's API: what a test checks the API against."""
    from contextlib import closing

    if str(db).startswith("postgresql://"):
        import psycopg

        from sdcguard.fleet.store.postgres.dialect import to_postgres

        with psycopg.connect(str(db), autocommit=True) as c:
            return [tuple(r) for r in c.execute(to_postgres(sql), params or None).fetchall()]
    import sqlite3

    with closing(sqlite3.connect(db)) as c:
        return c.execute(sql, params).fetchall()


def tallies_from_rows(path: str | Path) -> dict[tuple[str, str, int], tuple[int, int, float]]:
    """``day_tallies`` as the rows of ``results`` add them up (what the store must keep it equal to)."""
    rows = query(
        path,
        "SELECT device, family, CAST(started_at / 86400.0 AS INTEGER) AS d, "
        "TOTAL(CASE WHEN attempt = 0 THEN executions ELSE 0 END), "
        "TOTAL(CASE WHEN attempt = 0 AND passed = 0 THEN 1 ELSE 0 END), TOTAL(duration_s) FROM results "
        "GROUP BY device, family, d",
    )
    return {(d, f, day): (int(n), int(k), s) for d, f, day, n, k, s in rows}


def stored_tallies(path: str | Path) -> dict[tuple[str, str, int], tuple[int, int, float]]:
    """``day_tallies`` as stored, without the empty entries a moved or deleted row may leave."""
    rows = query(path, "SELECT device, family, day, executions, failures, test_s FROM day_tallies")
    return {(d, f, day): (n, k, s) for d, f, day, n, k, s in rows if (n, k) != (0, 0) or abs(s) >= 1e-6}


def assert_tallies_match_rows(path: str | Path) -> None:
    want, got = tallies_from_rows(path), stored_tallies(path)
    assert got.keys() == want.keys()
    for key, (n, k, s) in want.items():
        assert got[key][:2] == (n, k) and abs(got[key][2] - s) <= 1e-9 * max(1.0, abs(s)), (key, got[key], want[key])


def nvml_snapshot(
    *, dbe: int = 0, rows: int = 0, failure: bool = False, xids: Sequence[int] = (), t: float = NOW
) -> dict[str, object]:
    """A GPU's telemetry snapshot as :class:`fleet_scan.devices.telemetry.GpuTelemetry` takes it: ``dbe`` volatile
    double-bit ECC errors, ``rows`` rows remapped for uncorrectable errors, a remap ``failure``, the ``xids`` so far."""
    return {
        "time": t,
        "temperature_c": 41,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "power_w": 118.0,
        "utilization_pct": 0,
        "ecc_sbe_volatile": 3,
        "ecc_dbe_volatile": dbe,
        "ecc_sbe_aggregate": 7,
        "ecc_dbe_aggregate": dbe,
        "remapped_rows_correctable": 2,
        "remapped_rows_uncorrectable": rows,
        "remap_pending": False,
        "remap_failure": failure,
        "xids": list(xids),
    }


def gpu_scan(
    store: Store,
    device: str,
    *,
    t: float,
    before: object,
    after: object,
    status: ScanStatus = "complete",
    inject: str | None = None,
    host: str = "node1",
) -> int:
    """A GPU's scan through the store's write path, as the scanner writes one: its telemetry before it in the meta
    it begins with (``inject``: a fire drill's, as drills were written before they were kept apart), its telemetry
    after it with its end (``status``)."""
    store.scans.record_devices([DeviceInfo(id=device, host=host, kind="gpu", index=0)], now=t)
    sid = store.scans.begin(
        device=device, host=host, budget_s=60.0, started_at=t, meta={"inject": inject, "telemetry_before": before}
    )
    store.scans.record(
        sid, [result(device, t=t + 1)], finish=status, finished_at=t + 60, meta={"telemetry_after": after}
    )
    return sid
