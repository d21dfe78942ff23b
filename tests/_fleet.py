"""Shared helpers for the fleet-store tests: results, filled stores, file snapshots."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from sdcguard.records import CaseResult, DeviceInfo
from sdcguard.fleet.store import Store

NOW = 1_800_000_000.0
"""A fixed 'now' (2027-01-15) so windows are deterministic."""


def result(
    device: str, *, passed: bool = True, case: str = "gemm.fp32.n64", family: str = "gemm", t: float = NOW - 3600,
    digest: str | None = None, attempt: int = 0, sticky: bool | None = None, duration_s: float = 0.5,
) -> CaseResult:
    return CaseResult(
        device=device, case=case, family=family, seed=7, passed=passed, duration_s=duration_s, started_at=t,
        output_digest=digest if digest is not None else (None if passed else hashlib.sha256(device.encode()).hexdigest()),
        mismatches=0 if passed else 1, element=None if passed else 3, expected=None if passed else "0x3f800000",
        actual=None if passed else "0x3f800001", xor_mask=None if passed else "0x1", attempt=attempt, sticky=sticky,
    )


def scan(
    store: Store, device: str, results: Sequence[CaseResult], *, host: str = "node1", finish: str | None = "complete",
    t: float = NOW - 3600,
) -> int:
    store.upsert_device(DeviceInfo(id=device, host=host, kind=device.split(":")[0] if ":" in device else "gpu"), now=t)
    sid = store.begin_scan(device=device, host=host, budget_s=60.0, started_at=t)
    store.record_results(sid, results, finish=finish, finished_at=t + 60)  # type: ignore[arg-type]
    return sid


def clean(device: str, n: int, *, t: float = NOW - 3600, family: str = "gemm") -> list[CaseResult]:
    return [result(device, t=t + i, family=family) for i in range(n)]


def snapshot(path: Path) -> tuple[bytes, int]:
    """Bytes and mtime of a file, to prove a command left it untouched."""
    return path.read_bytes(), os.stat(path).st_mtime_ns
