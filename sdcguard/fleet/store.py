"""The fleet store: one SQLite file (WAL) holding devices, scans, results, incidents and quarantine state.

Every write runs in one ``BEGIN IMMEDIATE`` transaction: it takes the write lock up front, so concurrent writers
(several scanner processes, a training job) wait on the busy timeout instead of failing half-way with
"database is locked", and a process killed at any moment leaves the store as it was before or after the write.

Opening is careful: the file header is read *before* SQLite opens the file, so a text file, a foreign SQLite
database or a store written by a newer sdcguard is refused with one sentence and left byte-for-byte untouched.

Which executions count: every recorded execution of a golden case is an independent bit-exact comparison
against verified golden data, so it counts in the rates whatever became of its scan (a scanner killed mid-scan
must not hide the failures it already found). Only first attempts (``attempt = 0``) count: retests are run
*because* a case failed, and counting them would bias the rate. The scan's status matters for scan counts,
``last_scan`` and probation, which count only ``complete`` scans.
"""

from __future__ import annotations

import getpass
import json
import os
import sqlite3
import time
import uuid as _uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sqlite_utils

from ..devices import device_kind, hostname
from ..errors import BadInput, SchemaTooNew, StoreError
from ..records import CaseResult, DeviceInfo, Incident, ScanStatus
from .schema import APPLICATION_ID, SCHEMA_VERSION, SQLITE_MAGIC, migrate

__all__ = ["Store", "QuarantineEntry", "DeviceStatus", "DEFAULT_WINDOW_S", "default_actor"]

DeviceStatus = Literal["healthy", "suspect", "quarantined", "probation"]
"""``quarantined``/``probation``: the quarantine table says so. ``suspect``: not quarantined nor on probation, but
at least one failed execution in the window. ``healthy``: everything else (including never scanned)."""

DEFAULT_WINDOW_S = 7 * 86400.0
"""The default window of rates, suspect status and the policy: 7 days."""

_BUSY_TIMEOUT_S = 30.0
_TERMINAL: frozenset[str] = frozenset({"complete", "preempted", "interrupted", "error"})


def default_actor() -> str:
    """Who is acting, for the quarantine history: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{hostname()}"


@dataclass(frozen=True, kw_only=True)
class QuarantineEntry:
    """One row of the current quarantine state."""

    device: str
    state: Literal["quarantined", "probation"]
    since: float
    reason: str
    by: str
    host: str | None = None


def _check_header(path: Path) -> int:
    """Refuse what cannot be an sdcguard store before SQLite opens it; return the file's size."""
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a fleet store file")
    parent = path.parent
    if not parent.is_dir():
        what = f"{parent} is not a directory" if parent.exists() else f"directory {parent} does not exist"
        raise StoreError(f"cannot open fleet store {path}: {what}")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        return -1
    except PermissionError:
        raise StoreError(f"cannot read fleet store {path}: permission denied") from None
    except OSError as e:
        raise StoreError(f"cannot read fleet store {path}: {e.strerror or e}") from None
    if not header:
        return 0
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise StoreError(f"{path} is not an sdcguard fleet store (not a SQLite database); pass another --db")
    version = int.from_bytes(header[60:64], "big")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(_too_new(path, version))
    return len(header)


def _too_new(path: Path, version: int) -> str:
    return (
        f"{path} was written by a newer sdcguard (schema {version}; this one reads up to {SCHEMA_VERSION}): "
        "upgrade sdcguard to use it"
    )


def _jdump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class Store:
    """The fleet store. Open with :meth:`Store.open`; use as a context manager or call :meth:`close`.

    One ``Store`` belongs to one thread (SQLite connections are not shared); open one per process or thread.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, timeout_s: float = _BUSY_TIMEOUT_S) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self.path = path
        self.db = sqlite_utils.Database(conn)
        """The sqlite-utils view of the same connection, for reading (``store.db["results"].count``,
        ``store.db.query(...)``). Write through the store's methods or :meth:`write`: sqlite-utils' own writes
        commit as they go, which would break a transaction open here."""

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True, timeout_s: float = _BUSY_TIMEOUT_S) -> Store:
        """Open (and with ``create``, create or migrate) the store at ``path``.

        Raises :class:`StoreError` (not SQLite, unreadable, missing directory, missing file without ``create``)
        or :class:`SchemaTooNew`; in every such case the file is left untouched.
        """
        p = Path(path)
        size = _check_header(p)
        if size < 0 and not create:
            raise StoreError(f"no fleet store at {p} (run `sdcguard scan` first, or pass --db / $SDCGUARD_DB)")
        try:
            conn = sqlite3.connect(str(p), timeout=timeout_s, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open fleet store {p}: {e}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            store = cls(conn, p, timeout_s)
            store._prepare(create=create)
        except BaseException:
            conn.close()
            raise
        return store

    def _prepare(self, *, create: bool) -> None:
        p = self.path
        try:
            # One read transaction: a consistent snapshot even while another process creates the store.
            self._retry(lambda: self._conn.execute("BEGIN"))
            try:
                version = self._conn.execute("PRAGMA user_version").fetchone()[0]
                app = self._conn.execute("PRAGMA application_id").fetchone()[0]
                tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            finally:
                self._conn.execute("ROLLBACK")
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(_too_new(p, version))
            if app != APPLICATION_ID:
                if tables or version:
                    raise StoreError(f"{p} is a SQLite database but not an sdcguard fleet store; pass another --db")
                if not create:
                    raise StoreError(f"{p} is an empty file, not a fleet store; pass another --db")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{p} is not an sdcguard fleet store ({e}); pass another --db") from None
        # Only now (the file is ours, or empty) may SQLite write to it.
        self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone())
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        if version < SCHEMA_VERSION:
            with self.write() as conn:
                current = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
                if current > SCHEMA_VERSION:
                    raise SchemaTooNew(_too_new(p, current))
                if current < SCHEMA_VERSION:
                    migrate(conn, current)
                    conn.execute(
                        "INSERT OR REPLACE INTO meta(key, value) VALUES ('created_by', ?)", (f"sdcguard {_version()}",)
                    )

    def _retry(self, fn: Any) -> Any:
        # The busy timeout covers ordinary lock waits; a few operations (switching to WAL, the first read of a
        # fresh WAL file while another process creates it) can report "locked" at once under contention, so
        # retry those with backoff, but never wait longer than the busy timeout in all.
        deadline = time.monotonic() + self._timeout_s
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                text = str(e)
                if "locked" not in text and "busy" not in text:
                    raise StoreError(f"fleet store {self.path}: {text}") from None
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"fleet store {self.path} stayed locked by another process for over {self._timeout_s:g} s"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); rolled back if the body raises."""
        self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        try:
            self._retry(lambda: self._conn.execute("COMMIT"))
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read-only query, as dicts (through sqlite-utils)."""
        try:
            return list(self.db.query(sql, params))
        except sqlite3.OperationalError as e:
            raise StoreError(f"fleet store {self.path}: {e}") from None

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The single value of a read-only query."""
        row = self._conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    # ------------------------------------------------------------------ devices
    def upsert_device(self, info: DeviceInfo, *, now: float | None = None) -> None:
        """Insert or update a device; fields left ``None`` keep what is known."""
        t = time.time() if now is None else now
        with self.write() as conn:
            _upsert_device(conn, info, t)

    def devices(self) -> list[DeviceInfo]:
        """Every known device, by id."""
        return [
            DeviceInfo(
                id=r["id"], host=r["host"], kind=r["kind"], model=r["model"], serial=r["serial"],
                pci_bus_id=r["pci_bus_id"], index=r["idx"],
            )
            for r in self.query("SELECT * FROM devices ORDER BY id")
        ]

    # ------------------------------------------------------------------ scans and results
    def begin_scan(
        self, *, device: str, host: str, budget_s: float | None, meta: dict[str, Any] | None = None,
        started_at: float | None = None,
    ) -> int:
        """Start one device's scan (status ``running``); returns its id for :meth:`record_results`."""
        t = time.time() if started_at is None else started_at
        with self.write() as conn:
            _ensure_device(conn, device, host, t)
            cur = conn.execute(
                "INSERT INTO scans(uuid, device, host, started_at, budget_s, status, meta) "
                "VALUES (?, ?, ?, ?, ?, 'running', ?)",
                (_uuid.uuid4().hex, device, host, t, budget_s, _jdump(meta or {})),
            )
            return int(cur.lastrowid or 0)

    def record_results(
        self, scan_id: int, results: Sequence[CaseResult], *, finish: ScanStatus | None = None,
        finished_at: float | None = None,
    ) -> None:
        """Append results to a scan in one transaction; with ``finish``, set its final status in the same one."""
        if finish is not None and finish not in _TERMINAL:
            raise BadInput(f"finish must be one of {sorted(_TERMINAL)}, got {finish!r}")
        with self.write() as conn:
            row = conn.execute("SELECT device, host, status FROM scans WHERE id = ?", (scan_id,)).fetchone()
            if row is None:
                raise StoreError(f"no scan {scan_id} in {self.path}")
            scan_device, scan_host, status = row
            if status not in ("running", "interrupted"):
                raise StoreError(f"scan {scan_id} is already {status}; start a new scan")
            seq = conn.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM results WHERE scan = ?", (scan_id,)).fetchone()[0]
            rows = []
            failures = 0
            executions = 0
            for i, r in enumerate(results):
                if r.device != scan_device:
                    _ensure_device(conn, r.device, scan_host, r.started_at)
                failures += not r.passed
                executions += r.executions
                rows.append(_result_row(scan_id, seq + i, r))
            conn.executemany(_INSERT_RESULT, rows)
            conn.execute(
                "UPDATE scans SET executions = executions + ?, failures = failures + ? WHERE id = ?",
                (executions, failures, scan_id),
            )
            # Simulated fleets pass their own clock: "seen" is the latest time this write speaks of.
            seen = finished_at if finished_at is not None else max((r.started_at for r in results), default=None)
            if finish is not None:
                end = time.time() if finished_at is None else finished_at
                conn.execute("UPDATE scans SET status = ?, finished_at = ? WHERE id = ?", (finish, end, scan_id))
            if seen is not None:
                conn.execute("UPDATE devices SET last_seen = MAX(last_seen, ?) WHERE id = ?", (seen, scan_device))

    def finish_scan(self, scan_id: int, status: ScanStatus, *, finished_at: float | None = None) -> None:
        """Set a scan's final status without adding results."""
        self.record_results(scan_id, (), finish=status, finished_at=finished_at)

    def reap(self, *, grace_s: float = 600.0, default_budget_s: float = 3600.0, now: float | None = None) -> int:
        """Mark scans left ``running`` by a killed scanner as ``interrupted``; returns how many.

        A scan is stale when ``started_at + budget (or default_budget_s) + grace_s`` has passed.
        """
        t = time.time() if now is None else now
        with self.write() as conn:
            cur = conn.execute(
                "UPDATE scans SET status = 'interrupted', finished_at = ? WHERE status = 'running' "
                "AND started_at + COALESCE(budget_s, ?) + ? < ?",
                (t, default_budget_s, grace_s, t),
            )
            return cur.rowcount

    def scans(self, *, device: str | None = None) -> list[dict[str, Any]]:
        """Scan rows (newest first), optionally of one device."""
        where, params = ("WHERE device = ?", (device,)) if device else ("", ())
        return self.query(f"SELECT * FROM scans {where} ORDER BY started_at DESC, id DESC", params)

    def results(
        self, *, device: str | None = None, since: float | None = None, failed_only: bool = False,
        scan_id: int | None = None,
    ) -> list[CaseResult]:
        """Recorded executions as :class:`CaseResult`, oldest first."""
        clauses, params = [], []
        if device is not None:
            clauses.append("device = ?")
            params.append(device)
        if since is not None:
            clauses.append("started_at >= ?")
            params.append(since)
        if failed_only:
            clauses.append("passed = 0")
        if scan_id is not None:
            clauses.append("scan = ?")
            params.append(scan_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return [_row_result(r) for r in self.query(f"SELECT * FROM results {where} ORDER BY started_at, id", params)]

    # ------------------------------------------------------------------ incidents
    def record_incident(self, incident: Incident) -> int:
        """Record a training incident; returns its id."""
        named = {d for d in (incident.device, *incident.devices) if d}
        with self.write() as conn:
            host = incident.hosts[0] if incident.hosts else "unknown"
            for i, d in enumerate(incident.devices or ((incident.device,) if incident.device else ())):
                _ensure_device(conn, d, incident.hosts[i] if i < len(incident.hosts) else host, incident.time)
            cur = conn.execute(
                "INSERT INTO incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, "
                "sticky, job, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    _uuid.uuid4().hex, incident.kind, incident.step, _jdump(list(incident.suspect_ranks)),
                    incident.device, _jdump(list(incident.devices)), _jdump(list(incident.hosts)), incident.detail,
                    incident.parameter, None if incident.sticky is None else int(incident.sticky), incident.job,
                    incident.time,
                ),
            )
            iid = int(cur.lastrowid or 0)
            conn.executemany("INSERT INTO incident_devices(incident, device) VALUES (?, ?)", [(iid, d) for d in named])
            return iid

    def incidents(self, *, since: float | None = None, device: str | None = None) -> list[Incident]:
        """Recorded incidents, oldest first; with ``device``, those naming it."""
        clauses, params = [], []
        if since is not None:
            clauses.append("i.time >= ?")
            params.append(since)
        if device is not None:
            clauses.append("i.id IN (SELECT incident FROM incident_devices WHERE device = ?)")
            params.append(device)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.query(f"SELECT i.* FROM incidents i {where} ORDER BY i.time, i.id", params)
        return [
            Incident(
                kind=r["kind"], step=r["step"], suspect_ranks=tuple(json.loads(r["suspect_ranks"])),
                device=r["device"], detail=r["detail"], devices=tuple(json.loads(r["devices"])),
                hosts=tuple(json.loads(r["hosts"])), parameter=r["parameter"],
                sticky=None if r["sticky"] is None else bool(r["sticky"]), job=r["job"], time=r["time"],
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ quarantine
    def quarantine_status(
        self, device: str, *, window_s: float = DEFAULT_WINDOW_S, now: float | None = None
    ) -> DeviceStatus:
        """``quarantined`` / ``probation`` from the quarantine table; else ``suspect`` if the device failed at
        least one execution in the last ``window_s`` seconds; else ``healthy``."""
        state = self.scalar("SELECT state FROM quarantine WHERE device = ?", (device,))
        if state is not None:
            return state  # type: ignore[no-any-return]
        t = time.time() if now is None else now
        failed = self.scalar(
            "SELECT 1 FROM results WHERE passed = 0 AND started_at >= ? AND device = ? LIMIT 1", (t - window_s, device)
        )
        return "suspect" if failed else "healthy"

    def quarantine_list(self) -> list[QuarantineEntry]:
        """Devices quarantined or on probation, oldest first."""
        rows = self.query(
            "SELECT q.*, d.host FROM quarantine q LEFT JOIN devices d ON d.id = q.device ORDER BY q.since, q.device"
        )
        return [QuarantineEntry(**r) for r in rows]

    def quarantine_history(self, device: str | None = None) -> list[dict[str, Any]]:
        """Every quarantine change (who, when, why, action), oldest first."""
        where, params = ("WHERE device = ?", (device,)) if device else ("", ())
        return self.query(
            f"SELECT device, action, time, by, reason FROM quarantine_history {where} ORDER BY time, id", params
        )

    def quarantine(self, device: str, *, reason: str, by: str | None = None, now: float | None = None) -> None:
        """Take a device out of service (also from probation). ``BadInput`` if it already is quarantined."""
        t = time.time() if now is None else now
        with self.write() as conn:
            _quarantine(conn, device, reason=reason, by=by or default_actor(), now=t, strict=True)

    def release(self, device: str, *, reason: str, by: str | None = None, now: float | None = None) -> None:
        """Release a quarantined device by hand: it goes on probation until enough clean scans.

        ``BadInput`` (nothing written) if the device is unknown or not quarantined.
        """
        _need_reason(reason)
        t = time.time() if now is None else now
        with self.write() as conn:
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
        with self.write() as conn:
            _end_probation(conn, device, reason=reason, by=by, now=t)


# ---------------------------------------------------------------------- helpers (inside a transaction)
_RESULT_COLUMNS = (
    "scan", "seq", "device", "case_id", "family", "seed", "passed", "duration_s", "started_at", "output_digest",
    "mismatches", "element", "expected", "actual", "xor_mask", "location", "attempt", "sticky", "detail", "executions",
)
_INSERT_RESULT = (
    f"INSERT INTO results({', '.join(_RESULT_COLUMNS)}) VALUES ({', '.join('?' * len(_RESULT_COLUMNS))})"
)


def _result_row(scan_id: int, seq: int, r: CaseResult) -> tuple[Any, ...]:
    return (
        scan_id, seq, r.device, r.case, r.family, r.seed, int(r.passed), float(r.duration_s), float(r.started_at),
        r.output_digest, r.mismatches, r.element, r.expected, r.actual, r.xor_mask, r.location, r.attempt,
        None if r.sticky is None else int(r.sticky), _jdump(r.detail), int(r.executions),
    )


def _row_result(r: dict[str, Any]) -> CaseResult:
    return CaseResult(
        device=r["device"], case=r["case_id"], family=r["family"], seed=r["seed"], passed=bool(r["passed"]),
        duration_s=r["duration_s"], started_at=r["started_at"], output_digest=r["output_digest"],
        mismatches=r["mismatches"], element=r["element"], expected=r["expected"], actual=r["actual"],
        xor_mask=r["xor_mask"], location=r["location"], attempt=r["attempt"],
        sticky=None if r["sticky"] is None else bool(r["sticky"]), detail=json.loads(r["detail"]),
        executions=r["executions"],
    )


def _upsert_device(conn: sqlite3.Connection, info: DeviceInfo, t: float) -> None:
    conn.execute(
        "INSERT INTO devices(id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET host = excluded.host, kind = excluded.kind, "
        "model = COALESCE(excluded.model, model), serial = COALESCE(excluded.serial, serial), "
        "pci_bus_id = COALESCE(excluded.pci_bus_id, pci_bus_id), idx = COALESCE(excluded.idx, idx), "
        "first_seen = MIN(first_seen, excluded.first_seen), last_seen = MAX(last_seen, excluded.last_seen)",
        (info.id, info.host, info.kind, info.model, info.serial, info.pci_bus_id, info.index, t, t),
    )


def _ensure_device(conn: sqlite3.Connection, device: str, host: str, t: float) -> None:
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


def _history(conn: sqlite3.Connection, device: str, action: str, t: float, by: str, reason: str) -> None:
    conn.execute(
        "INSERT INTO quarantine_history(uuid, device, action, time, by, reason) VALUES (?, ?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, device, action, t, by, reason),
    )


def _quarantine(conn: sqlite3.Connection, device: str, *, reason: str, by: str, now: float, strict: bool) -> bool:
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


def _end_probation(conn: sqlite3.Connection, device: str, *, reason: str, by: str, now: float) -> None:
    cur = conn.execute("DELETE FROM quarantine WHERE device = ? AND state = 'probation'", (device,))
    if cur.rowcount:
        _history(conn, device, "probation_passed", now, by, reason)


def _version() -> str:
    from .. import __version__

    return __version__
