"""The fleet store: one SQLite file (WAL) holding devices, scans, results, incidents and quarantine state.

This module holds the writes; :mod:`.queries` the named reads, :mod:`.maintenance` merging and pruning,
:mod:`.connection` opening and transactions, :mod:`.schema` the tables. Nothing outside these modules writes
SQL: everything else asks :class:`Store` by name and gets records (:mod:`.rows`).

The store grows with scans and cases, not with executions: the passing first attempts of one case in one scan
are one row (their count, summed time, first and last start, and output digest), folded together as batches
arrive; every failed execution and every retest is its own row with its bits, element, location and retest
outcome. Counts, rates, bounds and testing time are exactly those of one row per execution.
"""

from __future__ import annotations

import getpass
import json
import operator
import os
import time
import uuid as _uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ...devices import hostname, unknown_device
from ...errors import BadInput, StoreError
from ...records import CaseResult, DeviceInfo, ScanStatus
from .maintenance import StoreMaintenance
from .quarantine import add_decision, add_history, end_probation, need_reason, quarantine_device
from .queries import StoreQueries
from .rows import Decision, PendingAction, QuarantineEntry
from .writes.results import append_results, ensure_device, jdump, merge_patch

__all__ = ["Store", "QuarantineEntry", "default_actor"]

_TERMINAL: frozenset[str] = frozenset({"complete", "preempted", "interrupted", "error"})


_ID = operator.attrgetter("id")
"""Devices' rows are updated in id order, as every other write takes them."""


def default_actor() -> str:
    """Who is acting, for the quarantine history: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{hostname()}"


class Store(StoreQueries, StoreMaintenance):
    """The fleet store. Open with :meth:`Store.open`; use as a context manager or call :meth:`close`.

    One ``Store`` belongs to one thread (SQLite connections are not shared); open one per process or thread.
    """

    # ------------------------------------------------------------------ devices
    def upsert_device(self, info: DeviceInfo, *, now: float | None = None) -> None:
        """Insert or update a device; fields left ``None`` keep what is known."""
        self.upsert_devices([info], now=now)

    def upsert_devices(self, infos: Sequence[DeviceInfo], *, now: float | None = None) -> None:
        """:meth:`upsert_device` for many devices in one transaction."""
        t = time.time() if now is None else now
        ordered = sorted(infos, key=_ID)
        with self._write() as conn:
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

    # ------------------------------------------------------------------ scans and results
    def begin_scan(
        self,
        *,
        device: str,
        host: str,
        budget_s: float | None,
        meta: dict[str, Any] | None = None,
        started_at: float | None = None,
        uuid: str | None = None,
    ) -> int:
        """Start one device's scan (status ``running``); returns its id for :meth:`record_results`. ``uuid``: the
        scan's natural key (default: a new one), which a spool's copy of a scan keeps."""
        t = time.time() if started_at is None else started_at
        with self._write() as conn:
            if device not in self._known_devices:  # known: record_results keeps its last_seen
                ensure_device(conn, device, host, t)
            cur = conn.execute(
                "INSERT INTO scans(uuid, device, host, started_at, budget_s, status, meta) "
                "VALUES (?, ?, ?, ?, ?, 'running', ?) RETURNING id",
                (uuid or _uuid.uuid4().hex, device, host, t, budget_s, jdump(meta or {})),
            )
            scan_id = int(cur.fetchone()[0])
        self._known_devices.add(device)
        return scan_id

    def record_results(
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
        with self._write() as conn:
            row = conn.execute(
                "SELECT device, host, status, (SELECT COALESCE(MAX(seq), -1) + 1 FROM results WHERE scan = ?), meta "
                "FROM scans WHERE id = ?",
                (scan_id, scan_id),
            ).fetchone()
            if row is None:
                raise StoreError(f"no scan {scan_id} in {self.path}")
            scan_device, scan_host, status, seq, old_meta = row
            self._lock_devices({scan_device, *(r.device for r in results)})
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

    def finish_scan(self, scan_id: int, status: ScanStatus, *, finished_at: float | None = None) -> None:
        """Set a scan's final status without adding results."""
        self.record_results(scan_id, (), finish=status, finished_at=finished_at)

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
        with self._write() as conn:
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

    # ------------------------------------------------------------------ a server's spool
    def mark_spool(self, server: str) -> None:
        """Mark this (SQLite) store as the spool of the server store ``server`` (its URL, which holds no
        password): :meth:`prune` then refuses it (:mod:`.spool`)."""
        if self.spool_for != server:
            with self._write() as conn:
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('spool_for', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (server,),
                )

    @property
    def spool_for(self) -> str | None:
        """The server store this store is the spool of (None: it is none)."""
        return self._meta("spool_for")

    # ------------------------------------------------------------------ roles (a server store)
    def grant(self, role: str, kind: str = "writer", *, run: bool = True) -> list[str]:
        """Grant the server role ``role`` what a scan node or job (``writer``) or a reader needs on this store
        (:mod:`.postgres.roles`); ``run`` False only says how. Returns the SQL statements."""
        if self.backend != "postgresql":
            raise BadInput(f"{self.path} is a SQLite file: its access is the file's permissions, not roles")
        from .postgres.roles import grant

        with self._write() as conn:
            return grant(conn, role, kind, run=run)  # type: ignore[arg-type]  # checked there

    # ------------------------------------------------------------------ quarantine by hand
    def quarantine(
        self, device: str, *, reason: str, by: str | None = None, now: float | None = None, new: bool = True
    ) -> None:
        """Take a device out of service (also from probation). ``BadInput`` if it already is quarantined.

        ``new``: a device the store has never seen may be quarantined (recorded with it); False refuses it with
        :class:`BadInput` naming the closest known ids (a typo must not quarantine a device that does not exist).
        """
        t = time.time() if now is None else now
        with self._write() as conn:
            self._backend.lock("quarantine")  # two policy runs at once decide once
            if not new and conn.execute("SELECT 1 FROM devices WHERE id = ?", (device,)).fetchone() is None:
                known = [r[0] for r in conn.execute("SELECT id FROM devices ORDER BY id")]
                raise unknown_device(
                    device,
                    known,
                    what=f"cannot quarantine {device}",
                    hint="; new=True quarantines a device no scan has recorded yet",
                )
            quarantine_device(conn, device, reason=reason, by=by or default_actor(), now=t, strict=True)

    def release(self, device: str, *, reason: str, by: str | None = None, now: float | None = None) -> None:
        """Release a quarantined device by hand: it goes on probation until enough clean scans.

        ``BadInput`` (nothing written) if the device is unknown or not quarantined.
        """
        need_reason(reason)
        t = time.time() if now is None else now
        with self._write() as conn:
            self._backend.lock("quarantine")  # two policy runs at once decide once
            state = conn.execute("SELECT state FROM quarantine WHERE device = ?", (device,)).fetchone()
            if state is None or state[0] != "quarantined":
                known = conn.execute("SELECT 1 FROM devices WHERE id = ?", (device,)).fetchone()
                what = "is not quarantined" if known else "is not a known device"
                now_state = " (it is on probation)" if state else ""
                raise BadInput(f"cannot release {device}: it {what}{now_state}; see `sdcguard quarantine list`")
            conn.execute(
                "UPDATE quarantine SET state = 'probation', since = ?, reason = ?, by = ? WHERE device = ?",
                (t, reason, by or default_actor(), device),
            )
            add_history(conn, device, "release", t, by or default_actor(), reason)

    def end_probation(self, device: str, *, reason: str, by: str = "policy", now: float | None = None) -> None:
        """A device on probation passed it: back to healthy (no quarantine row)."""
        t = time.time() if now is None else now
        with self._write() as conn:
            self._backend.lock("quarantine")  # two policy runs at once decide once
            end_probation(conn, device, reason=reason, by=by, now=t)

    # ------------------------------------------------------------------ what a policy run decided
    def record_policy_run(
        self,
        *,
        now: float,
        notes: Sequence[Decision] = (),
        quarantine: Mapping[str, str] = {},
        passed_probation: Mapping[str, str] = {},
    ) -> list[Decision]:
        """Record one policy run in one transaction: ``notes`` (breaker trips and other fleet-wide findings),
        quarantines (``device -> reason``; a device already quarantined is left as it is) and probations passed.
        Returns the decisions recorded, in order."""
        out: list[Decision] = []
        with self._write() as conn:
            self._backend.lock("quarantine")  # two policy runs at once decide once
            for d in notes:
                add_decision(conn, d, now)
                out.append(d)
            for dev, why in quarantine.items():
                if quarantine_device(conn, dev, reason=why, by="policy", now=now, strict=False):
                    d = Decision(device=dev, decision="quarantine", reason=f"{dev}: {why}")
                    add_decision(conn, d, now)
                    out.append(d)
            for dev, why in passed_probation.items():
                if end_probation(conn, dev, reason=why, by="policy", now=now):
                    d = Decision(device=dev, decision="probation_passed", reason=f"{dev}: {why}")
                    add_decision(conn, d, now)
                    out.append(d)
        return out

    def pending_actions(self, names: Sequence[str], *, now: float) -> list[PendingAction]:
        """Actions (by template name) not yet run successfully for each device's current quarantine; one action
        row per (quarantine event, template) is created here the first time."""
        with self._write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO actions(uuid, device, action, quarantined_since, created) "
                "SELECT lower(hex(randomblob(16))), device, ?, since, ? FROM quarantine WHERE state = 'quarantined'",
                [(name, now) for name in names],
            )
        rows = self._rows(
            "SELECT a.id, a.device, a.action, q.reason, COALESCE(d.host, 'unknown') FROM actions a "
            "JOIN quarantine q ON q.device = a.device AND q.since = a.quarantined_since AND q.state = 'quarantined' "
            "LEFT JOIN devices d ON d.id = a.device WHERE a.done = 0 ORDER BY a.id"
        )
        return [PendingAction(id=r[0], device=r[1], action=r[2], reason=r[3], host=r[4]) for r in rows]

    def record_action_attempt(
        self,
        action_id: int,
        *,
        argv: Sequence[str],
        returncode: int | None,
        ok: bool,
        output: str,
        now: float,
        decision: Decision,
    ) -> None:
        """One run of a pending action, and the decision that says how it went."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO action_attempts(uuid, action_id, time, argv, returncode, ok, output) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (_uuid.uuid4().hex, action_id, now, json.dumps(list(argv)), returncode, int(ok), output),
            )
            conn.execute("UPDATE actions SET attempts = attempts + 1, done = ? WHERE id = ?", (int(ok), action_id))
            add_decision(conn, decision, now)

    def action_attempts(self) -> list[dict[str, Any]]:
        """Every attempt of every action (device, action, when, argv, return code, ok, output), oldest first."""
        return self._dicts(
            "SELECT a.device, a.action, t.time, t.argv, t.returncode, t.ok, t.output FROM action_attempts t "
            "JOIN actions a ON a.id = t.action_id ORDER BY t.id"
        )
