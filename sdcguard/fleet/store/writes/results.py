"""A scan's results as rows: the one ``results`` row layout (by column name), and the batch write that folds the
passing first attempts of a case into one row per scan while every failure and retest keeps its own (run inside
the store's write transaction, with the day and case tallies of the same rows)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ....devices import device_kind
from ....errors import BadInput
from ....records import CaseResult
from .tallies import DayTallies, day_of

__all__ = [
    "RESULT_COLUMNS",
    "INSERT_RESULT",
    "append_results",
    "result_row",
    "case_result",
    "ensure_device",
    "jdump",
    "merge_patch",
]

RESULT_COLUMNS = (
    "scan",
    "seq",
    "device",
    "case_id",
    "family",
    "seed",
    "passed",
    "duration_s",
    "started_at",
    "output_digest",
    "mismatches",
    "element",
    "expected",
    "actual",
    "xor_mask",
    "location",
    "attempt",
    "sticky",
    "detail",
    "executions",
    "last_started_at",
)
INSERT_RESULT = (
    f"INSERT INTO results({', '.join(RESULT_COLUMNS)}) VALUES ({', '.join(':' + c for c in RESULT_COLUMNS)})"
)
"""Binds a row by column name (:func:`result_row`'s dict), never by position."""


def jdump(value: Any) -> str:
    """JSON as the store keeps it (keys sorted, anything else as its string)."""
    return json.dumps(value, sort_keys=True, default=str)


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7396, what SQLite's ``json_patch`` does): objects
    merge key by key, a ``null`` removes its key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def append_results(
    conn: Any,
    scan_id: int,
    seq: int,
    scan_device: str,
    scan_host: str,
    results: Sequence[CaseResult],
    known: set[tuple[str, str]],
) -> tuple[int, int]:
    """Write a batch from row ``seq`` on: passing first attempts folded into the scan's row of their case, the
    rest one row each. Returns the first-attempt executions and failures it adds."""
    if not results:
        return 0, 0
    folded = (
        {}
        if seq == 0
        else {
            (c, f): (i, t, n, secs)
            for c, f, i, t, n, secs in conn.execute(
                "SELECT case_id, family, id, started_at, executions, duration_s FROM results "
                "WHERE scan = ? AND passed = 1 AND attempt = 0",
                (scan_id,),
            )
        }
    )
    for r in results:
        if r.device != scan_device:
            ensure_device(conn, r.device, scan_host, r.started_at)
    new, passes = _rows(scan_id, seq, results, folded)
    conn.executemany(INSERT_RESULT, new)
    grown = _tally(conn, new, passes, folded)
    if grown:
        conn.executemany(
            "UPDATE results SET executions = executions + ?, duration_s = duration_s + ?, "
            "started_at = MIN(started_at, CAST(? AS REAL)), "
            "last_started_at = MAX(COALESCE(last_started_at, started_at), CAST(? AS REAL)) WHERE id = ?",
            grown,
        )
    digests = {(case, p[0].output_digest): p[3] for (case, _), p in passes.items() if p[0].output_digest}
    new_digests = [(c, d, t) for (c, d), t in digests.items() if (c, d) not in known]
    if new_digests:  # sorted: concurrent writers of one server take these keys' row locks in one order
        conn.executemany(
            "INSERT OR IGNORE INTO pass_digests(case_id, digest, first_seen) VALUES (?, ?, ?)", sorted(new_digests)
        )
        known.update((c, d) for c, d, _ in new_digests)
    first = [r for r in results if r.attempt == 0]
    return sum(r.executions for r in first), sum(not r.passed for r in first)


_Passes = dict[tuple[str, str], list[Any]]
"""(case, family) -> [first result, executions, seconds, first start, last start] of a batch's passing first
attempts."""


def _rows(
    scan_id: int, seq: int, results: Sequence[CaseResult], folded: dict[tuple[str, str], Any]
) -> tuple[list[dict[str, Any]], _Passes]:
    """The batch's new rows (a case's first passing row in this scan carries its folded totals) and its passes."""
    passes: _Passes = {}
    rows: list[dict[str, Any] | tuple[tuple[str, str], int]] = []
    for r in results:
        if r.passed and r.attempt == 0:
            key = (r.case, r.family)
            p = passes.get(key)
            last = r.last_started_at if r.last_started_at is not None else r.started_at
            if p is None:
                passes[key] = [r, r.executions, r.duration_s, r.started_at, last]
                if key not in folded:
                    rows.append((key, seq))  # a placeholder: the row is written once its totals are known
                    seq += 1
            else:
                p[1] += r.executions
                p[2] += r.duration_s
                p[3] = min(p[3], r.started_at)
                p[4] = max(p[4], last)
            continue
        rows.append(result_row(scan_id, seq, r))
        seq += 1
    new: list[dict[str, Any]] = []
    for item in rows:
        if isinstance(item, tuple):
            key, s = item
            r, n, secs, first, last = passes[key]
            new.append(
                {
                    **result_row(scan_id, s, r),
                    "duration_s": float(secs),
                    "started_at": float(first),
                    "executions": int(n),
                    "last_started_at": last if last != first else None,
                }
            )
        else:
            new.append(item)
    return new, passes


def _tally(
    conn: Any, new: list[dict[str, Any]], passes: _Passes, folded: dict[tuple[str, str], Any]
) -> list[tuple[Any, ...]]:
    """Add the batch to the day and case tallies; the updates of the rows it grew (cases already folded in this
    scan)."""
    tallies = DayTallies()
    for row in new:
        first_attempt = row["attempt"] == 0
        tallies.add(
            row["device"],
            row["family"],
            row["started_at"],
            row["executions"] if first_attempt else 0,
            int(first_attempt and not row["passed"]),
            row["duration_s"],
            case=row["case_id"] if first_attempt and row["passed"] else None,
        )
    grown = []
    for key, (r, n, secs, first, last) in passes.items():
        if key not in folded:
            continue
        row_id, was_start, was_n, was_secs = folded[key]
        grown.append((n, secs, first, last, row_id))
        # the row's day is that of its first execution: it moves only if this batch started before the row did
        if day_of(first) >= day_of(was_start):
            tallies.add(r.device, r.family, was_start, n, 0, secs, case=r.case)
        else:
            tallies.add(r.device, r.family, was_start, -was_n, 0, -was_secs, case=r.case)
            tallies.add(r.device, r.family, first, was_n + n, 0, was_secs + secs, case=r.case)
    tallies.write(conn)
    return grown


def result_row(scan_id: int, seq: int, r: CaseResult) -> dict[str, Any]:
    """One ``results`` row, by column name (:data:`RESULT_COLUMNS`)."""
    return {
        "scan": scan_id,
        "seq": seq,
        "device": r.device,
        "case_id": r.case,
        "family": r.family,
        "seed": r.seed,
        "passed": int(r.passed),
        "duration_s": float(r.duration_s),
        "started_at": float(r.started_at),
        "output_digest": r.output_digest,
        "mismatches": r.mismatches,
        "element": r.element,
        "expected": r.expected,
        "actual": r.actual,
        "xor_mask": r.xor_mask,
        "location": r.location,
        "attempt": r.attempt,
        "sticky": None if r.sticky is None else int(r.sticky),
        "detail": jdump(r.detail) if r.detail else "{}",
        "executions": int(r.executions),
        "last_started_at": r.last_started_at,
    }


def ensure_device(conn: Any, device: str, host: str, t: float) -> None:
    """Make sure ``device`` has a row (kind from its id), seen at ``t``."""
    try:
        kind = device_kind(device)
    except BadInput:
        kind = "gpu" if device.startswith("GPU") else "sim"  # an odd id from elsewhere is still recorded
    conn.execute(
        "INSERT INTO devices(id, host, kind, first_seen, last_seen) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET last_seen = MAX(devices.last_seen, excluded.last_seen)",
        (device, host, kind, t, t),
    )


def case_result(r: dict[str, Any]) -> CaseResult:
    """The :class:`CaseResult` of one ``results`` row (by column name): what :func:`result_row` wrote."""
    return CaseResult(
        device=r["device"],
        case=r["case_id"],
        family=r["family"],
        seed=r["seed"],
        passed=bool(r["passed"]),
        duration_s=r["duration_s"],
        started_at=r["started_at"],
        output_digest=r["output_digest"],
        mismatches=r["mismatches"],
        element=r["element"],
        expected=r["expected"],
        actual=r["actual"],
        xor_mask=r["xor_mask"],
        location=r["location"],
        attempt=r["attempt"],
        sticky=None if r["sticky"] is None else bool(r["sticky"]),
        detail=json.loads(r["detail"]),
        executions=r["executions"],
        last_started_at=r["last_started_at"],
    )
