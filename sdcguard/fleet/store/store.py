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

import dataclasses
import getpass
import json
import os
import time
import uuid as _uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ...devices import device_kind, hostname, unknown_device
from ...errors import BadInput, StoreError
from ...records import CaseResult, DeviceInfo, Incident, ScanStatus
from .maintenance import DayTallies, StoreMaintenance, day_of
from .queries import StoreQueries
from .rows import Decision, PendingAction, QuarantineEntry

__all__ = ["Store", "QuarantineEntry", "default_actor"]

_TERMINAL: frozenset[str] = frozenset({"complete", "preempted", "interrupted", "error"})
_RESULT_COLUMNS = (
    "scan", "seq", "device", "case_id", "family", "seed", "passed", "duration_s", "started_at", "output_digest",
    "mismatches", "element", "expected", "actual", "xor_mask", "location", "attempt", "sticky", "detail", "executions",
    "last_started_at",
)
_INSERT_RESULT = (f"INSERT INTO results({', '.join(_RESULT_COLUMNS)}) "
                  f"VALUES ({', '.join(':' + c for c in _RESULT_COLUMNS)})")
"""Binds a row by column name (:func:`_result_row`'s dict), never by position."""


def default_actor() -> str:
    """Who is acting, for the quarantine history: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{hostname()}"


def _jdump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


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
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO devices(id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET host = excluded.host, "
                "kind = excluded.kind, model = COALESCE(excluded.model, model), "
                "serial = COALESCE(excluded.serial, serial), pci_bus_id = COALESCE(excluded.pci_bus_id, pci_bus_id), "
                "idx = COALESCE(excluded.idx, idx), first_seen = MIN(first_seen, excluded.first_seen), "
                "last_seen = MAX(last_seen, excluded.last_seen)",
                [(i.id, i.host, i.kind, i.model, i.serial, i.pci_bus_id, i.index, t, t) for i in infos],
            )

    # ------------------------------------------------------------------ scans and results
    def begin_scan(
        self, *, device: str, host: str, budget_s: float | None, meta: dict[str, Any] | None = None,
        started_at: float | None = None,
    ) -> int:
        """Start one device's scan (status ``running``); returns its id for :meth:`record_results`."""
        t = time.time() if started_at is None else started_at
        with self._write() as conn:
            if device not in self._known_devices:  # known: record_results keeps its last_seen
                _ensure_device(conn, device, host, t)
            cur = conn.execute(
                "INSERT INTO scans(uuid, device, host, started_at, budget_s, status, meta) "
                "VALUES (?, ?, ?, ?, ?, 'running', ?)",
                (_uuid.uuid4().hex, device, host, t, budget_s, _jdump(meta or {})),
            )
            scan_id = int(cur.lastrowid or 0)
        self._known_devices.add(device)
        return scan_id

    def record_results(
        self, scan_id: int, results: Sequence[CaseResult], *, finish: ScanStatus | None = None,
        finished_at: float | None = None, total: int | None = None, meta: Mapping[str, Any] | None = None,
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
                "SELECT device, host, status, (SELECT COALESCE(MAX(seq), -1) + 1 FROM results WHERE scan = ?) "
                "FROM scans WHERE id = ?", (scan_id, scan_id)).fetchone()
            if row is None:
                raise StoreError(f"no scan {scan_id} in {self.path}")
            scan_device, scan_host, status, seq = row
            if status not in ("running", "interrupted"):
                raise StoreError(f"scan {scan_id} is already {status}; start a new scan")
            executions, failures = _append(conn, scan_id, seq, scan_device, scan_host, results, self._known_digests)
            seen = finished_at if finished_at is not None else max(
                (r.last_started_at or r.started_at for r in results), default=None)
            end = None if finish is None else time.time() if finished_at is None else finished_at
            conn.execute(
                "UPDATE scans SET executions = executions + ?, failures = failures + ?, status = COALESCE(?, status), "
                "finished_at = COALESCE(?, finished_at), total = COALESCE(?, total) WHERE id = ?",
                (executions, failures, finish, end, total if finish is not None else None, scan_id),
            )
            if meta:
                conn.execute("UPDATE scans SET meta = json_patch(meta, ?) WHERE id = ?", (_jdump(dict(meta)), scan_id))
            if seen is not None:
                # Simulated fleets pass their own clock: "seen" is the latest time this write speaks of.
                conn.execute("UPDATE devices SET last_seen = MAX(last_seen, ?) WHERE id = ?", (seen, scan_device))

    def finish_scan(self, scan_id: int, status: ScanStatus, *, finished_at: float | None = None) -> None:
        """Set a scan's final status without adding results."""
        self.record_results(scan_id, (), finish=status, finished_at=finished_at)

    def reap(
        self, *, grace_s: float = 600.0, default_budget_s: float = 3600.0, now: float | None = None,
        device: str | None = None, host: str | None = None,
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
                    "AND device = ? AND host = ?", (t, device, host),
                )
            else:
                cur = conn.execute(
                    "UPDATE scans SET status = 'interrupted', finished_at = ? WHERE status = 'running' "
                    "AND started_at + COALESCE(budget_s, ?) + ? < ?",
                    (t, default_budget_s, grace_s, t),
                )
            return cur.rowcount

    # ------------------------------------------------------------------ incidents
    def record_incident(self, incident: Incident) -> int:
        """Record a training incident; returns its id. The whole record is kept as JSON next to the indexed
        columns, so an optional field added to :class:`Incident` later needs no change here."""
        named = {d for d in (incident.device, *incident.devices) if d}
        record = _jdump(dataclasses.asdict(incident))
        with self._write() as conn:
            host = incident.hosts[0] if incident.hosts else "unknown"
            for i, d in enumerate(incident.devices or ((incident.device,) if incident.device else ())):
                _ensure_device(conn, d, incident.hosts[i] if i < len(incident.hosts) else host, incident.time)
            cur = conn.execute(
                "INSERT INTO incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, "
                "sticky, job, time, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    _uuid.uuid4().hex, incident.kind, incident.step, _jdump(list(incident.suspect_ranks)),
                    incident.device, _jdump(list(incident.devices)), _jdump(list(incident.hosts)), incident.detail,
                    incident.parameter, None if incident.sticky is None else int(incident.sticky), incident.job,
                    incident.time, record,
                ),
            )
            iid = int(cur.lastrowid or 0)
            conn.executemany("INSERT INTO incident_devices(incident, device) VALUES (?, ?)", [(iid, d) for d in named])
            return iid

    def record_checkpoint(self, *, checkpoint_id: str, step: int, verified: bool, digest: str = "",
                          job: str | None = None, now: float | None = None, status: str = "saved",
                          detail: str = "") -> int:
        """Record a checkpoint the training guard saved (``status="failed"``: its write failed, with ``detail``;
        never verified); returns its row id."""
        if not checkpoint_id:
            raise BadInput("a checkpoint needs an id")
        if status not in ("saved", "failed"):
            raise BadInput(f"checkpoint status must be 'saved' or 'failed', not {status!r}")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO checkpoints(uuid, checkpoint_id, step, verified, digest, job, time, status, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_uuid.uuid4().hex, str(checkpoint_id), int(step), int(bool(verified) and status == "saved"),
                 digest or "", job, time.time() if now is None else now, status, detail),
            )
            return int(cur.lastrowid or 0)

    def record_scrub(self, *, checkpoint_id: str, status: str, tensors: int, bytes: int,
                     bad: Sequence[str] = (), detail: str = "", now: float | None = None) -> int:
        """Record one checkpoint re-read at rest (``sdcguard scrub``); returns its row id."""
        if status not in ("clean", "corrupt", "unreadable"):
            raise BadInput(f"scrub status must be clean, corrupt or unreadable, not {status!r}")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO checkpoint_scrubs(uuid, checkpoint_id, status, tensors, bytes, bad, detail, host, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_uuid.uuid4().hex, str(checkpoint_id), status, int(tensors), int(bytes), json.dumps(list(bad)),
                 detail, hostname(), time.time() if now is None else now),
            )
            return int(cur.lastrowid or 0)

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
            if not new and conn.execute("SELECT 1 FROM devices WHERE id = ?", (device,)).fetchone() is None:
                known = [r[0] for r in conn.execute("SELECT id FROM devices ORDER BY id")]
                raise unknown_device(device, known, what=f"cannot quarantine {device}",
                                     hint="; new=True quarantines a device no scan has recorded yet")
            _quarantine(conn, device, reason=reason, by=by or default_actor(), now=t, strict=True)

    def release(self, device: str, *, reason: str, by: str | None = None, now: float | None = None) -> None:
        """Release a quarantined device by hand: it goes on probation until enough clean scans.

        ``BadInput`` (nothing written) if the device is unknown or not quarantined.
        """
        _need_reason(reason)
        t = time.time() if now is None else now
        with self._write() as conn:
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
            _history(conn, device, "release", t, by or default_actor(), reason)

    def end_probation(self, device: str, *, reason: str, by: str = "policy", now: float | None = None) -> None:
        """A device on probation passed it: back to healthy (no quarantine row)."""
        t = time.time() if now is None else now
        with self._write() as conn:
            _end_probation(conn, device, reason=reason, by=by, now=t)

    # ------------------------------------------------------------------ what a policy run decided
    def record_policy_run(
        self, *, now: float, notes: Sequence[Decision] = (), quarantine: Mapping[str, str] = {},
        passed_probation: Mapping[str, str] = {},
    ) -> list[Decision]:
        """Record one policy run in one transaction: ``notes`` (breaker trips and other fleet-wide findings),
        quarantines (``device -> reason``; a device already quarantined is left as it is) and probations passed.
        Returns the decisions recorded, in order."""
        out: list[Decision] = []
        with self._write() as conn:
            for d in notes:
                _decide(conn, d, now)
                out.append(d)
            for dev, why in quarantine.items():
                if _quarantine(conn, dev, reason=why, by="policy", now=now, strict=False):
                    d = Decision(device=dev, decision="quarantine", reason=f"{dev}: {why}")
                    _decide(conn, d, now)
                    out.append(d)
            for dev, why in passed_probation.items():
                if _end_probation(conn, dev, reason=why, by="policy", now=now):
                    d = Decision(device=dev, decision="probation_passed", reason=f"{dev}: {why}")
                    _decide(conn, d, now)
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
        self, action_id: int, *, argv: Sequence[str], returncode: int | None, ok: bool, output: str, now: float,
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
            _decide(conn, decision, now)

    def action_attempts(self) -> list[dict[str, Any]]:
        """Every attempt of every action (device, action, when, argv, return code, ok, output), oldest first."""
        return self._dicts(
            "SELECT a.device, a.action, t.time, t.argv, t.returncode, t.ok, t.output FROM action_attempts t "
            "JOIN actions a ON a.id = t.action_id ORDER BY t.id"
        )


# ---------------------------------------------------------------------- inside a transaction
def _append(
    conn: Any, scan_id: int, seq: int, scan_device: str, scan_host: str, results: Sequence[CaseResult],
    known: set[tuple[str, str]],
) -> tuple[int, int]:
    """Write a batch from row ``seq`` on: passing first attempts folded into the scan's row of their case, the
    rest one row each. Returns the first-attempt executions and failures it adds."""
    if not results:
        return 0, 0
    folded = {} if seq == 0 else {(c, f): (i, t, n, secs) for c, f, i, t, n, secs in conn.execute(
        "SELECT case_id, family, id, started_at, executions, duration_s FROM results WHERE scan = ? AND passed = 1 "
        "AND attempt = 0", (scan_id,))}
    passes: dict[tuple[str, str], list[Any]] = {}  # (case, family) -> [first result, executions, seconds, first, last]
    rows: list[dict[str, Any] | tuple[tuple[str, str], int]] = []
    executions = failures = 0
    for r in results:
        if r.device != scan_device:
            _ensure_device(conn, r.device, scan_host, r.started_at)
        if r.attempt == 0:
            executions += r.executions
            failures += not r.passed
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
        rows.append(_result_row(scan_id, seq, r))
        seq += 1
    new: list[dict[str, Any]] = []
    for item in rows:
        if isinstance(item, tuple):  # a case's first passing row in this scan: its folded totals
            key, s = item
            r, n, secs, first, last = passes[key]
            new.append({**_result_row(scan_id, s, r), "duration_s": float(secs), "started_at": float(first),
                        "executions": int(n), "last_started_at": last if last != first else None})
        else:
            new.append(item)
    conn.executemany(_INSERT_RESULT, new)
    tallies = DayTallies()
    for row in new:
        first_attempt = row["attempt"] == 0
        tallies.add(row["device"], row["family"], row["started_at"], row["executions"] if first_attempt else 0,
                    int(first_attempt and not row["passed"]), row["duration_s"],
                    case=row["case_id"] if first_attempt and row["passed"] else None)
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
    if grown:
        conn.executemany(
            "UPDATE results SET executions = executions + ?, duration_s = duration_s + ?, "
            "started_at = MIN(started_at, ?), last_started_at = MAX(COALESCE(last_started_at, started_at), ?) "
            "WHERE id = ?", grown,
        )
    digests = {(case, p[0].output_digest): p[3] for (case, _), p in passes.items() if p[0].output_digest}
    new_digests = [(c, d, t) for (c, d), t in digests.items() if (c, d) not in known]
    if new_digests:
        conn.executemany("INSERT OR IGNORE INTO pass_digests(case_id, digest, first_seen) VALUES (?, ?, ?)",
                         new_digests)
        known.update((c, d) for c, d, _ in new_digests)
    return executions, failures


def _result_row(scan_id: int, seq: int, r: CaseResult) -> dict[str, Any]:
    """One ``results`` row, by column name (:data:`_RESULT_COLUMNS`)."""
    return {
        "scan": scan_id, "seq": seq, "device": r.device, "case_id": r.case, "family": r.family, "seed": r.seed,
        "passed": int(r.passed), "duration_s": float(r.duration_s), "started_at": float(r.started_at),
        "output_digest": r.output_digest, "mismatches": r.mismatches, "element": r.element, "expected": r.expected,
        "actual": r.actual, "xor_mask": r.xor_mask, "location": r.location, "attempt": r.attempt,
        "sticky": None if r.sticky is None else int(r.sticky), "detail": _jdump(r.detail) if r.detail else "{}",
        "executions": int(r.executions), "last_started_at": r.last_started_at,
    }


def _ensure_device(conn: Any, device: str, host: str, t: float) -> None:
    try:
        kind = device_kind(device)
    except BadInput:
        kind = "gpu" if device.startswith("GPU") else "sim"  # an odd id from elsewhere is still recorded
    conn.execute(
        "INSERT INTO devices(id, host, kind, first_seen, last_seen) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET last_seen = MAX(last_seen, excluded.last_seen)",
        (device, host, kind, t, t),
    )


def _need_reason(reason: str) -> None:
    if not reason or not reason.strip():
        raise BadInput("a reason is required (--reason TEXT): the quarantine history keeps why")


def _history(conn: Any, device: str, action: str, t: float, by: str, reason: str) -> None:
    conn.execute(
        "INSERT INTO quarantine_history(uuid, device, action, time, by, reason) VALUES (?, ?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, device, action, t, by, reason),
    )


def _decide(conn: Any, d: Decision, t: float) -> None:
    conn.execute(
        "INSERT INTO policy_decisions(uuid, time, device, decision, reason) VALUES (?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, t, d.device, d.decision, d.reason),
    )


def _quarantine(conn: Any, device: str, *, reason: str, by: str, now: float, strict: bool) -> bool:
    """Quarantine ``device``; False (nothing written) if it already is. ``strict``: raise instead."""
    _need_reason(reason)
    state = conn.execute("SELECT state FROM quarantine WHERE device = ?", (device,)).fetchone()
    if state is not None and state[0] == "quarantined":
        if strict:
            raise BadInput(f"{device} is already quarantined; see `sdcguard quarantine list`")
        return False
    known = conn.execute("SELECT 1 FROM devices WHERE id = ?", (device,)).fetchone()
    if not known:
        try:
            kind = device_kind(device)
        except BadInput as e:
            raise BadInput(f"cannot quarantine {device!r}: {e}") from None
        host = device.split(":")[1] if kind == "cpu" else "unknown"
        conn.execute(
            "INSERT INTO devices(id, host, kind, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)",
            (device, host, kind, now, now),
        )
    conn.execute(
        "INSERT INTO quarantine(device, state, since, reason, by) VALUES (?, 'quarantined', ?, ?, ?) "
        "ON CONFLICT(device) DO UPDATE SET state = 'quarantined', since = excluded.since, reason = excluded.reason, "
        "by = excluded.by",
        (device, now, reason, by),
    )
    _history(conn, device, "quarantine", now, by, reason)
    return True


def _end_probation(conn: Any, device: str, *, reason: str, by: str, now: float) -> bool:
    cur = conn.execute("DELETE FROM quarantine WHERE device = ? AND state = 'probation'", (device,))
    if cur.rowcount:
        _history(conn, device, "probation_passed", now, by, reason)
    return bool(cur.rowcount)
