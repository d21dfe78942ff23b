"""Merge per-node fleet stores into one, idempotently.

Every row that can be merged has a natural key: a scan its ``uuid``, a result ``(scan uuid, seq)``, an incident,
a quarantine change, a policy decision and an action attempt their ``uuid``, an action
``(device, action, quarantined_since)``. Rows already present are skipped, so merging the same input twice (or an
input that already went through another merge) counts nothing twice. A scan that was ``running`` in an earlier
copy takes its final status from a later one. The current quarantine state of a device is replayed from the
merged history: its latest change wins.

Each input is merged in one transaction, read through ``ATTACH`` (SQL set operations, no Python row loops), and
never written: inputs are checked read-only first and must have this version's schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput, SchemaTooNew, StoreError
from .schema import APPLICATION_ID, SCHEMA_VERSION
from .store import Store, _check_header

__all__ = ["MergeStats", "merge_stores", "check_input"]

_COUNTED = ("devices", "scans", "results", "incidents", "quarantine_history")


@dataclass(frozen=True, kw_only=True)
class MergeStats:
    """Rows one input added to the output (0 everywhere when it was merged before)."""

    source: str
    devices: int
    scans: int
    results: int
    incidents: int
    quarantine_history: int


def check_input(path: Path) -> None:
    """Refuse an input that is missing, not a store, or of another schema version, without writing to it."""
    if not path.exists():
        raise StoreError(f"merge input {path} does not exist")
    if _check_header(path) <= 0:
        raise StoreError(f"merge input {path} is empty, not a fleet store")
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app = conn.execute("PRAGMA application_id").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"merge input {path} cannot be read as a fleet store: {e}") from None
    if app != APPLICATION_ID:
        raise StoreError(f"merge input {path} is a SQLite database but not an sdcguard fleet store")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"merge input {path} was written by a newer sdcguard (schema {version}); upgrade sdcguard")
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"merge input {path} has the older schema {version}: open it once with this sdcguard "
            f"(`sdcguard --db {path} report`) to migrate it, then merge"
        )


def merge_stores(out: Path, inputs: Sequence[Path]) -> list[MergeStats]:
    """Merge ``inputs`` into the store at ``out`` (created if missing); returns what each input added."""
    if not inputs:
        raise BadInput("merge needs at least one input store")
    out_resolved = out.resolve()
    for p in inputs:
        if p.resolve() == out_resolved:
            raise BadInput(f"cannot merge {p} into itself")
        check_input(p)
    stats = []
    with Store.open(out, create=True) as store:
        for p in inputs:
            stats.append(_merge_one(store, p))
    return stats


def _counts(store: Store) -> dict[str, int]:
    return {t: store.db[t].count for t in _COUNTED}


def _merge_one(store: Store, path: Path) -> MergeStats:
    conn = store._conn
    conn.execute("ATTACH DATABASE ? AS src", (str(path),))
    try:
        with store.write():
            before = _counts(store)
            for sql in _MERGE_SQL:
                conn.execute(sql)
            _replay_quarantine(conn)
            after = _counts(store)
    finally:
        conn.execute("DETACH DATABASE src")
    return MergeStats(source=str(path), **{t: after[t] - before[t] for t in _COUNTED})


_MERGE_SQL = (
    # Devices: the union, widest first/last seen, known facts kept.
    """INSERT INTO main.devices(id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen)
       SELECT id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen FROM src.devices WHERE true
       ON CONFLICT(id) DO UPDATE SET
         host = CASE WHEN excluded.last_seen > devices.last_seen THEN excluded.host ELSE devices.host END,
         model = COALESCE(devices.model, excluded.model), serial = COALESCE(devices.serial, excluded.serial),
         pci_bus_id = COALESCE(devices.pci_bus_id, excluded.pci_bus_id), idx = COALESCE(devices.idx, excluded.idx),
         first_seen = MIN(devices.first_seen, excluded.first_seen),
         last_seen = MAX(devices.last_seen, excluded.last_seen)""",
    # Scans by uuid; a final status from the input replaces a 'running'/'interrupted' one here.
    """INSERT INTO main.scans(uuid, device, host, started_at, finished_at, budget_s, status, meta)
       SELECT uuid, device, host, started_at, finished_at, budget_s, status, meta FROM src.scans WHERE true
       ON CONFLICT(uuid) DO UPDATE SET status = excluded.status, finished_at = excluded.finished_at
       WHERE scans.status IN ('running', 'interrupted') AND excluded.status NOT IN ('running', 'interrupted')""",
    # Results by (scan uuid, seq).
    """INSERT OR IGNORE INTO main.results(scan, seq, device, case_id, family, seed, passed, duration_s, started_at,
         output_digest, mismatches, element, expected, actual, xor_mask, location, attempt, sticky, detail, executions)
       SELECT m.id, r.seq, r.device, r.case_id, r.family, r.seed, r.passed, r.duration_s, r.started_at,
         r.output_digest, r.mismatches, r.element, r.expected, r.actual, r.xor_mask, r.location, r.attempt, r.sticky,
         r.detail, r.executions
       FROM src.results r JOIN src.scans s ON s.id = r.scan JOIN main.scans m ON m.uuid = s.uuid""",
    # Scan counters follow the merged results.
    """UPDATE main.scans SET
         executions = (SELECT COALESCE(SUM(r.executions), 0) FROM main.results r WHERE r.scan = scans.id),
         failures = (SELECT COUNT(*) FROM main.results r WHERE r.scan = scans.id AND r.passed = 0)
       WHERE uuid IN (SELECT uuid FROM src.scans)""",
    """INSERT OR IGNORE INTO main.incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail,
         parameter, sticky, job, time)
       SELECT uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, sticky, job, time
       FROM src.incidents""",
    """INSERT OR IGNORE INTO main.incident_devices(incident, device)
       SELECT m.id, d.device FROM src.incident_devices d JOIN src.incidents i ON i.id = d.incident
       JOIN main.incidents m ON m.uuid = i.uuid""",
    """INSERT OR IGNORE INTO main.quarantine_history(uuid, device, action, time, by, reason)
       SELECT uuid, device, action, time, by, reason FROM src.quarantine_history""",
    """INSERT OR IGNORE INTO main.policy_decisions(uuid, time, device, decision, reason)
       SELECT uuid, time, device, decision, reason FROM src.policy_decisions""",
    """INSERT INTO main.actions(uuid, device, action, quarantined_since, created, done, attempts)
       SELECT uuid, device, action, quarantined_since, created, done, attempts FROM src.actions WHERE true
       ON CONFLICT(device, action, quarantined_since) DO UPDATE SET done = MAX(actions.done, excluded.done)
       ON CONFLICT(uuid) DO UPDATE SET done = MAX(actions.done, excluded.done)""",
    """INSERT OR IGNORE INTO main.action_attempts(uuid, action_id, time, argv, returncode, ok, output)
       SELECT t.uuid, m.id, t.time, t.argv, t.returncode, t.ok, t.output
       FROM src.action_attempts t JOIN src.actions a ON a.id = t.action_id
       JOIN main.actions m ON m.device = a.device AND m.action = a.action
         AND m.quarantined_since = a.quarantined_since""",
    """UPDATE main.actions SET attempts = (SELECT COUNT(*) FROM main.action_attempts t WHERE t.action_id = actions.id)
       WHERE id IN (SELECT action_id FROM main.action_attempts)""",
)


def _replay_quarantine(conn: sqlite3.Connection) -> None:
    """Current state of every device the input's history names = its latest change in the merged history."""
    rows = conn.execute(
        """SELECT h.device, h.action, h.time, h.by, h.reason FROM main.quarantine_history h
           WHERE h.device IN (SELECT device FROM src.quarantine_history)
             AND h.id = (SELECT id FROM main.quarantine_history x WHERE x.device = h.device
                         ORDER BY x.time DESC, x.id DESC LIMIT 1)"""
    ).fetchall()
    for device, action, t, by, reason in rows:
        if action == "probation_passed":
            conn.execute("DELETE FROM main.quarantine WHERE device = ?", (device,))
            continue
        state = "quarantined" if action == "quarantine" else "probation"
        conn.execute(
            "INSERT INTO main.quarantine(device, state, since, reason, by) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(device) DO UPDATE SET state = excluded.state, since = excluded.since, "
            "reason = excluded.reason, by = excluded.by",
            (device, state, t, reason, by),
        )
