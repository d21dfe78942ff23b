"""Devices, scans and their results (``store.scans``): what a scanner writes, batch by batch, and what reads them
row by row.

The store grows with scans and cases, not with executions: the passing first attempts of one case in one scan
are one row (their count, summed time, first and last start, and output digest), folded together as batches
arrive; every failed execution and every retest is its own row with its bits, element, location and retest
outcome (:mod:`.writes.results`). Counts, rates, bounds and testing time are exactly those of one row per execution.
"""

from __future__ import annotations

import json
import operator
import sqlite3
import time
import uuid as _uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import BadInput, StoreError
from ...records import CaseResult, DeviceInfo, ScanStatus
from .core import StoreCore, in_devices, where_clause
from .writes.results import append_results, case_result, ensure_device, jdump, merge_patch
from .writes.tallies import apply_running_deltas, tally_rows

__all__ = ["Scans", "DRILL_SCAN"]

_TERMINAL: frozenset[str] = frozenset({"complete", "preempted", "interrupted", "error"})

DRILL_SCAN = 'meta LIKE \'%"inject": "%\''
"""A scan of a fire drill written before drills were kept apart: its meta names what it injected (a real scan's
meta says ``"inject": null``). Never evidence: reads of scans' meta leave it out."""
_LEGACY_DRILL = f"{DRILL_SCAN} AND status != 'running'"
"""A finished one: what :meth:`Scans.legacy_drills` moves."""

_SCAN_COLUMNS = "uuid, device, host, started_at, finished_at, budget_s, status, meta, total"
_RESULT_COLUMNS = (
    "scan, seq, device, case_id, family, seed, passed, duration_s, started_at, output_digest, mismatches, element, "
    "expected, actual, xor_mask, location, attempt, sticky, detail, executions, last_started_at"
)
_DEVICE_COLUMNS = "id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen"


def _marks(columns: str) -> str:
    """The placeholders of an INSERT of ``columns``."""
    return ", ".join("?" * len(columns.split(", ")))


_ID = operator.attrgetter("id")
"""Devices' rows are updated in id order, as every other write takes them."""


class Scans:
    """Devices, scans and results: the scanner's writes (each one transaction) and the reads of their rows.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._known_digests: set[tuple[str, str]] = set()
        """``(case, digest)`` pairs this connection knows ``pass_digests`` holds (rows are never deleted)."""
        self._known_devices: set[str] = set()
        """Devices this connection knows the ``devices`` table holds (rows are never deleted)."""

    def record_devices(self, infos: Sequence[DeviceInfo], *, now: float | None = None) -> None:
        """Insert or update devices in one transaction (in id order, as every other write takes them); fields left
        ``None`` keep what is known, and each device's version moves (its identity is in every report)."""
        t = time.time() if now is None else now
        ordered = sorted(infos, key=_ID)
        with self._core.write() as conn:
            conn.executemany(
                "INSERT INTO devices(id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET host = excluded.host, "
                "kind = excluded.kind, model = COALESCE(excluded.model, devices.model), "
                "serial = COALESCE(excluded.serial, devices.serial), "
                "pci_bus_id = COALESCE(excluded.pci_bus_id, devices.pci_bus_id), "
                "idx = COALESCE(excluded.idx, devices.idx), first_seen = MIN(devices.first_seen, excluded.first_seen), "
                "last_seen = MAX(devices.last_seen, excluded.last_seen), version = devices.version + 1",
                [(i.id, i.host, i.kind, i.model, i.serial, i.pci_bus_id, i.index, t, t) for i in ordered],
            )

    def begin(
        self,
        *,
        device: str,
        host: str,
        budget_s: float | None,
        meta: dict[str, Any] | None = None,
        started_at: float | None = None,
        uuid: str | None = None,
    ) -> int:
        """Start one device's scan (status ``running``); returns its id for :meth:`record`. ``uuid``: the
        scan's natural key (default: a new one), which a spool's copy of a scan keeps."""
        t = time.time() if started_at is None else started_at
        with self._core.write() as conn:
            if device not in self._known_devices:  # known: record keeps its last_seen
                ensure_device(conn, device, host, t)
            # above every id this store ever gave: SQLite gives a pruned top id again, and a merge's watermark
            # would take the new scan for the one it rolled up (a prune keeps the floor: maintenance.py)
            floor = int(self._core.meta("scan_id_floor") or 0)
            row = (uuid or _uuid.uuid4().hex, device, host, t, budget_s, jdump(meta or {}))
            cur = conn.execute(
                "INSERT INTO scans(uuid, device, host, started_at, budget_s, status, meta) "
                "VALUES (?, ?, ?, ?, ?, 'running', ?) RETURNING id"
                if not floor
                else "INSERT INTO scans(id, uuid, device, host, started_at, budget_s, status, meta) "
                "VALUES ((SELECT MAX(COALESCE(MAX(id), 0), ?) + 1 FROM scans), ?, ?, ?, ?, ?, 'running', ?) "
                "RETURNING id",
                row if not floor else (floor, *row),
            )
            scan_id = int(cur.fetchone()[0])
        self._known_devices.add(device)
        return scan_id

    def record(
        self,
        scan_id: int,
        results: Sequence[CaseResult],
        *,
        finish: ScanStatus | None = None,
        finished_at: float | None = None,
        total: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Append results to a scan in one transaction; with ``finish``, set its final status in the same one.

        Passing first attempts are folded into the scan's one row per case (and family); failed executions and retests
        get a row each. ``total``: the executions (retests included) the scanner produced in the whole scan, kept with
        the final status so a complete scan with missing results can be told. ``meta``: keys merged into the scan's
        meta.
        """
        if finish is not None and finish not in _TERMINAL:
            raise BadInput(f"finish must be one of {sorted(_TERMINAL)}, got {finish!r}")
        with self._core.write() as conn:
            row = conn.execute(
                "SELECT device, host, status, (SELECT COALESCE(MAX(seq), -1) + 1 FROM results WHERE scan = ?), meta "
                "FROM scans WHERE id = ?",
                (scan_id, scan_id),
            ).fetchone()
            if row is None:
                raise StoreError(f"no scan {scan_id} in {self._core.path}")
            scan_device, scan_host, status, seq, old_meta = row
            self._core.lock_devices({scan_device, *(r.device for r in results)})
            if status not in ("running", "interrupted"):
                raise StoreError(f"scan {scan_id} is already {status}; start a new scan")
            executions, failures = append_results(
                conn, scan_id, seq, scan_device, scan_host, results, self._known_digests
            )
            seen = (
                finished_at
                if finished_at is not None
                else max((r.last_started_at or r.started_at for r in results), default=None)
            )
            end = None if finish is None else time.time() if finished_at is None else finished_at
            conn.execute(
                "UPDATE scans SET executions = executions + ?, failures = failures + ?, "
                "status = COALESCE(CAST(? AS TEXT), status), "
                "finished_at = COALESCE(?, finished_at), total = COALESCE(?, total) WHERE id = ?",
                (executions, failures, finish, end, total if finish is not None else None, scan_id),
            )
            if meta:
                patched = merge_patch(json.loads(old_meta), json.loads(jdump(dict(meta))))
                conn.execute("UPDATE scans SET meta = ? WHERE id = ?", (jdump(patched), scan_id))
            if seen is not None:
                # Simulated fleets pass their own clock: "seen" is the latest time this write speaks of.
                conn.execute(
                    "UPDATE devices SET last_seen = MAX(last_seen, ?) WHERE id = ?", (float(seen), scan_device)
                )

    def finish(self, scan_id: int, status: ScanStatus, *, finished_at: float | None = None) -> None:
        """Set a scan's final status without adding results."""
        self.record(scan_id, (), finish=status, finished_at=finished_at)

    def reap(
        self,
        *,
        grace_s: float = 600.0,
        default_budget_s: float = 3600.0,
        now: float | None = None,
        device: str | None = None,
        host: str | None = None,
    ) -> int:
        """Mark scans left ``running`` by a killed scanner as ``interrupted``; returns how many.

        The one reaping path. Without ``device``: a scan is stale when ``started_at + budget (or
        default_budget_s) + grace_s`` has passed (the policy's sweep). With ``device`` and ``host``: every scan of
        that device on that host still ``running`` (the scanner holding the device's lock knows nobody else is
        scanning it).
        """
        t = time.time() if now is None else now
        with self._core.write() as conn:
            if device is not None:
                cur = conn.execute(
                    "UPDATE scans SET status = 'interrupted', finished_at = ? WHERE status = 'running' "
                    "AND device = ? AND host = ?",
                    (t, device, host),
                )
            else:
                cur = conn.execute(
                    "UPDATE scans SET status = 'interrupted', finished_at = ? WHERE status = 'running' "
                    "AND started_at + COALESCE(budget_s, ?) + ? < ?",
                    (t, default_budget_s, grace_s, t),
                )
            return cur.rowcount

    def devices(self, ids: Sequence[str] | None = None) -> list[DeviceInfo]:
        """Every known device (or those of ``ids`` the store knows), by id."""
        scope, sp = in_devices(ids, "id")
        return [
            DeviceInfo(id=r[0], host=r[1], kind=r[2], model=r[3], serial=r[4], pci_bus_id=r[5], index=r[6])
            for r in self._core.rows(
                f"SELECT id, host, kind, model, serial, pci_bus_id, idx FROM devices WHERE true{scope} ORDER BY id", sp
            )
        ]

    def device(self, device: str) -> DeviceInfo | None:
        """One device, or None if the store does not know it."""
        found = [
            d
            for d in self._core.rows(
                "SELECT id, host, kind, model, serial, pci_bus_id, idx FROM devices WHERE id = ?", (device,)
            )
        ]
        if not found:
            return None
        r = found[0]
        return DeviceInfo(id=r[0], host=r[1], kind=r[2], model=r[3], serial=r[4], pci_bus_id=r[5], index=r[6])

    def history(self, *, device: str | None = None) -> list[dict[str, Any]]:
        """Scan rows (newest first), optionally of one device."""
        where, params = where_clause(("device = ?", device or None))
        return self._core.dicts(f"SELECT * FROM scans {where} ORDER BY started_at DESC, id DESC", params)

    def results(
        self,
        *,
        device: str | None = None,
        since: float | None = None,
        failed_only: bool = False,
        scan_id: int | None = None,
    ) -> list[CaseResult]:
        """Recorded rows as :class:`CaseResult` (a passing row may stand for several executions), oldest first."""
        where, params = where_clause(
            ("device = ?", device),
            ("started_at >= ?", since),
            ("passed = 0", True if failed_only else None),
            ("scan = ?", scan_id),
        )
        return [
            case_result(r) for r in self._core.dicts(f"SELECT * FROM results {where} ORDER BY started_at, id", params)
        ]

    def legacy_drills(self) -> dict[int, str]:
        """The finished scans of fire drills this store holds from before drills were kept apart (``"inject"`` in
        their meta), id to device: :func:`~.drills.move_legacy_drills` moves them to the drill store."""
        rows = self._core.rows(f"SELECT id, device FROM scans WHERE {_LEGACY_DRILL} ORDER BY id")
        return {int(r[0]): str(r[1]) for r in rows}

    def copy_out(self, ids: Sequence[int], path: str) -> None:
        """Write the scans ``ids``, their results and their devices into the new, empty SQLite store at ``path``
        (one transaction there), so that a merge can take them into another store."""
        chosen = ", ".join(str(int(i)) for i in ids) or "NULL"
        scans = self._core.rows(f"SELECT id, {_SCAN_COLUMNS} FROM scans WHERE id IN ({chosen})")
        results = self._core.rows(f"SELECT {_RESULT_COLUMNS} FROM results WHERE scan IN ({chosen})")
        devices = self._core.rows(
            f"SELECT {_DEVICE_COLUMNS} FROM devices WHERE id IN (SELECT device FROM scans WHERE id IN ({chosen}))"
        )
        out = sqlite3.connect(path)
        try:
            with out:
                out.executemany(f"INSERT INTO devices({_DEVICE_COLUMNS}) VALUES ({_marks(_DEVICE_COLUMNS)})", devices)
                out.executemany(f"INSERT INTO scans(id, {_SCAN_COLUMNS}) VALUES (?, {_marks(_SCAN_COLUMNS)})", scans)
                out.executemany(f"INSERT INTO results({_RESULT_COLUMNS}) VALUES ({_marks(_RESULT_COLUMNS)})", results)
        finally:
            out.close()

    def take_out(self, ids: Sequence[int]) -> tuple[int, int]:
        """Delete the finished scans ``ids`` and their results in one transaction, their tallies with them (the day,
        family and case tallies lose exactly what the rows added, as a merge replacing a scan's rows takes them
        away); ``(scans, results)`` deleted. Their devices' versions move: every kept report of them is computed
        again. Only for rows that were never evidence (a drill's): what a policy already decided from them stays
        in the quarantine history."""
        chosen = ", ".join(str(int(i)) for i in ids)
        if not chosen:
            return 0, 0
        with self._core.write() as conn:
            devices = conn.execute(
                f"SELECT device FROM scans WHERE id IN ({chosen}) UNION "
                f"SELECT device FROM results WHERE scan IN ({chosen})"
            ).fetchall()
            self._core.lock_devices(r[0] for r in devices)
            finished = f"SELECT id FROM scans WHERE id IN ({chosen}) AND status != 'running'"
            tally_rows(conn, finished, -1)
            apply_running_deltas(conn)
            results = conn.execute(f"DELETE FROM results WHERE scan IN ({finished})").rowcount
            scans = conn.execute(f"DELETE FROM scans WHERE id IN ({chosen}) AND status != 'running'").rowcount
            conn.execute(
                "DELETE FROM day_tallies WHERE executions = 0 AND failures = 0 AND abs(test_s) < 1e-6 AND device IN "
                "(SELECT value FROM json_each(?))",
                (json.dumps(sorted({r[0] for r in devices})),),
            )
        return scans, results
