"""Merging another store's rows into this one, inside the merge's transaction (the rules are in
:mod:`..maintenance`'s docstring): devices, scans and their results past the watermarks, the append-only tables by
uuid, the watermarks themselves, and the quarantine state replayed from the merged history."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any

from ....durations import DAY_S as _DAY_S
from .tallies import apply_running_deltas, tally_rows

__all__ = [
    "WATERMARKED",
    "identities_changing",
    "merge_devices",
    "merge_scans",
    "merge_appended",
    "check_marks",
    "read_mark",
    "remember",
    "set_meta",
    "replay_quarantine",
]


_OPEN = "('running', 'interrupted')"


WATERMARKED = ("scans", "incidents", "quarantine_history", "policy_decisions", "action_attempts")
"""The input tables a merge takes past a watermark (row id), in the column order of ``merge_sources``."""


_REOPEN_S = _DAY_S
"""An input's ``interrupted`` scan is read again by merges for this long after it was marked: a scanner the
policy's sweep took for dead may still finish it. Older ones are final (and ``prune`` rolls them up)."""


def identities_changing(conn: Any) -> list[str]:
    """The input's devices whose host, model or index :func:`merge_devices` will change (what a report prints of a
    device's identity; its kind never changes)."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT s.id FROM src.devices s JOIN main.devices d ON d.id = s.id WHERE (s.last_seen > d.last_seen "
            "AND s.host <> d.host) OR (d.model IS NULL AND s.model IS NOT NULL) OR (d.idx IS NULL AND s.idx IS NOT "
            "NULL)"
        ).fetchall()
    ]


def merge_devices(conn: Any) -> int:
    """Devices: the union, widest first/last seen, known facts kept; returns how many are new."""
    before_devices = conn.execute("SELECT COUNT(*) FROM main.devices").fetchone()[0]
    conn.execute(
        """INSERT INTO main.devices(id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen)
           SELECT id, host, kind, model, serial, pci_bus_id, idx, first_seen, last_seen FROM src.devices WHERE true
           ON CONFLICT(id) DO UPDATE SET
             host = CASE WHEN excluded.last_seen > devices.last_seen THEN excluded.host ELSE devices.host END,
             model = COALESCE(devices.model, excluded.model), serial = COALESCE(devices.serial, excluded.serial),
             pci_bus_id = COALESCE(devices.pci_bus_id, excluded.pci_bus_id),
             idx = COALESCE(devices.idx, excluded.idx), first_seen = MIN(devices.first_seen, excluded.first_seen),
             last_seen = MAX(devices.last_seen, excluded.last_seen)"""
    )
    return int(conn.execute("SELECT COUNT(*) FROM main.devices").fetchone()[0]) - int(before_devices)


def merge_scans(
    conn: Any,
    scans_after: int,
    reopened: list[int],
    horizon: float,
    lock: Callable[[Iterable[str]], None],
    *,
    taken: int | None,
    analyze: Callable[[str], None] = lambda table: None,
) -> tuple[int, int, int, list[int]]:
    """New scans and those still open at the last merge, with their rows; ``(new scans, new rows, skipped, late
    days)``. ``lock``: takes the devices' locks (:meth:`~..core.StoreCore.lock_devices`) before their
    tallies change. ``analyze``: gives the planner the size of a temporary table just filled (a server's planner
    otherwise takes it for a large one and reads the store's results whole).

    A scan older than the output's retention horizon is in its roll-ups already when an earlier merge took it;
    one past ``taken`` never was (an input that was away longer than the retention: a spool forwarded after a
    long outage), so it is merged like the others, and the days it started on (``late days``) are for the caller
    to roll up at once. ``taken``: the input's top scan id at the last merge, the watermark as remembered even
    when :func:`check_marks` rewinds it (its row pruned on the input, or another there): every scan an earlier
    merge saw has an id up to it, and one above it did not exist then (ids only grow past the rows held). None
    (``full``): unknown, every old scan is taken for one in the roll-ups."""
    skipped, late_days = _select_scans(conn, scans_after, reopened, horizon, taken=taken)
    analyze("merge_scans")
    lock(
        r[0]
        for r in conn.execute(
            "SELECT s.device FROM src.scans s JOIN temp.merge_scans m ON m.src_id = s.id UNION "
            "SELECT r.device FROM src.results r JOIN temp.merge_scans m ON r.scan = m.src_id"
        ).fetchall()
    )
    new_scans = conn.execute(
        "SELECT COUNT(*) FROM temp.merge_scans m WHERE NOT EXISTS (SELECT 1 FROM main.scans s WHERE s.uuid = m.uuid)"
    ).fetchone()[0]
    conn.execute(
        """INSERT INTO main.scans(uuid, device, host, started_at, finished_at, budget_s, status, meta, total)
           SELECT s.uuid, s.device, s.host, s.started_at, s.finished_at, s.budget_s, s.status, s.meta, s.total
           FROM src.scans s JOIN temp.merge_scans m ON m.src_id = s.id WHERE true
           ON CONFLICT(uuid) DO UPDATE SET status = excluded.status, finished_at = excluded.finished_at,
             total = excluded.total, meta = excluded.meta
           WHERE scans.status IN ('running', 'interrupted') AND excluded.status NOT IN ('running', 'interrupted')"""
    )
    conn.execute("UPDATE temp.merge_scans SET dst_id = (SELECT id FROM main.scans s WHERE s.uuid = merge_scans.uuid)")
    before_results = conn.execute(
        "SELECT COUNT(*) FROM main.results WHERE scan IN (SELECT dst_id FROM temp.merge_scans)"
    ).fetchone()[0]
    # The day tallies follow the rows: minus those this merge replaces, plus what it writes.
    tally_rows(conn, "SELECT dst_id FROM temp.merge_scans", -1)
    # Results by (scan, seq); the input's own rows of its scans win (a passing row's count only grows).
    conn.execute(
        """INSERT INTO main.results(scan, seq, device, case_id, family, seed, passed, duration_s, started_at,
             output_digest, mismatches, element, expected, actual, xor_mask, location, attempt, sticky, detail,
             executions, last_started_at)
           SELECT m.dst_id, r.seq, r.device, r.case_id, r.family, r.seed, r.passed, r.duration_s, r.started_at,
             r.output_digest, r.mismatches, r.element, r.expected, r.actual, r.xor_mask, r.location, r.attempt,
             r.sticky, r.detail, r.executions, r.last_started_at
           FROM temp.merge_scans m JOIN src.results r ON r.scan = m.src_id WHERE true
           ON CONFLICT(scan, seq) DO UPDATE SET executions = excluded.executions,
             duration_s = excluded.duration_s, started_at = excluded.started_at,
             last_started_at = excluded.last_started_at, sticky = excluded.sticky, detail = excluded.detail"""
    )
    tally_rows(conn, "SELECT dst_id FROM temp.merge_scans", 1)
    apply_running_deltas(conn)
    results = (
        conn.execute(
            "SELECT COUNT(*) FROM main.results WHERE scan IN (SELECT dst_id FROM temp.merge_scans)"
        ).fetchone()[0]
        - before_results
    )
    # Scan counters follow the merged rows (first attempts, like the rates).
    conn.execute(
        """UPDATE main.scans SET
             executions = (SELECT TOTAL(r.executions) FROM main.results r WHERE r.scan = scans.id AND r.attempt = 0),
             failures = (SELECT COUNT(*) FROM main.results r WHERE r.scan = scans.id AND r.attempt = 0
                         AND r.passed = 0)
           WHERE id IN (SELECT dst_id FROM temp.merge_scans)"""
    )
    return new_scans, results, skipped, late_days


def _select_scans(
    conn: Any, scans_after: int, reopened: list[int], horizon: float, *, taken: int | None
) -> tuple[int, list[int]]:
    """Fill ``temp.merge_scans`` with the input's scans this merge takes; ``(skipped, late days)``."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS merge_scans(src_id INTEGER PRIMARY KEY, uuid TEXT, dst_id INTEGER)")
    conn.execute("DELETE FROM temp.merge_scans")
    conn.execute(
        "INSERT INTO temp.merge_scans(src_id, uuid) SELECT id, uuid FROM src.scans "
        "WHERE (id > ? OR id IN (SELECT CAST(value AS INTEGER) FROM json_each(?)))",
        (scans_after, json.dumps(reopened)),
    )
    # Scans older than our retention horizon are in our roll-ups already, except those we still hold open
    # (prune leaves a running scan alone): those take their final state from the input as usual.
    old = (
        "src_id IN (SELECT id FROM src.scans WHERE started_at < ?) "
        f"AND uuid NOT IN (SELECT uuid FROM main.scans WHERE status IN {_OPEN})"
    )
    if taken is not None:
        old += " AND src_id <= ?"
    bounds = (horizon, taken) if taken is not None else (horizon,)
    skipped = conn.execute(f"SELECT COUNT(*) FROM temp.merge_scans WHERE {old}", bounds).fetchone()[0]
    conn.execute(f"DELETE FROM temp.merge_scans WHERE {old}", bounds)
    late_days = [
        int(r[0])
        for r in conn.execute(
            f"SELECT DISTINCT CAST(s.started_at / {_DAY_S} AS INTEGER) FROM src.scans s JOIN temp.merge_scans m "
            "ON m.src_id = s.id WHERE s.started_at < ? AND s.status != 'running' "
            "AND m.uuid NOT IN (SELECT uuid FROM main.scans) ORDER BY 1",
            (horizon,),
        ).fetchall()
    ]
    return skipped, late_days


def merge_appended(conn: Any, inc_after: int, hist_after: int, dec_after: int, att_after: int) -> tuple[int, int]:
    """Pass digests, incidents, quarantine history, decisions, actions and their attempts past the watermark;
    ``(new incidents, new history rows)``."""
    conn.execute(
        """INSERT INTO main.pass_digests(case_id, digest, first_seen)
           SELECT case_id, digest, first_seen FROM src.pass_digests WHERE true
           ON CONFLICT(case_id, digest) DO UPDATE SET first_seen = MIN(pass_digests.first_seen, excluded.first_seen)"""
    )
    incidents = conn.execute(
        """INSERT OR IGNORE INTO main.incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail,
             parameter, sticky, job, time, record)
           SELECT uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, sticky, job, time,
             record FROM src.incidents WHERE id > ?""",
        (inc_after,),
    ).rowcount
    conn.execute(
        """INSERT OR IGNORE INTO main.incident_devices(incident, device)
           SELECT m.id, d.device FROM src.incident_devices d JOIN src.incidents i ON i.id = d.incident
           JOIN main.incidents m ON m.uuid = i.uuid WHERE i.id > ?""",
        (inc_after,),
    )
    history = conn.execute(
        """INSERT OR IGNORE INTO main.quarantine_history(uuid, device, action, time, by, reason)
           SELECT uuid, device, action, time, by, reason FROM src.quarantine_history WHERE id > ?""",
        (hist_after,),
    ).rowcount
    conn.execute(
        """INSERT OR IGNORE INTO main.policy_decisions(uuid, time, device, decision, reason)
           SELECT uuid, time, device, decision, reason FROM src.policy_decisions WHERE id > ?""",
        (dec_after,),
    )
    # An action is the same by its uuid or by (device, action, quarantined_since): new ones are added, and one
    # known by either key is done once either copy is.
    conn.execute(
        """INSERT OR IGNORE INTO main.actions(uuid, device, action, quarantined_since, created, done, attempts)
           SELECT uuid, device, action, quarantined_since, created, done, attempts FROM src.actions"""
    )
    same = (
        "FROM src.actions a WHERE (a.device = actions.device AND a.action = actions.action "
        "AND a.quarantined_since = actions.quarantined_since) OR a.uuid = actions.uuid"
    )
    conn.execute(
        f"UPDATE main.actions SET done = MAX(actions.done, (SELECT MAX(a.done) {same})) "
        f"WHERE EXISTS (SELECT 1 {same}) AND actions.done < (SELECT MAX(a.done) {same})"
    )
    conn.execute(
        """INSERT OR IGNORE INTO main.action_attempts(uuid, action_id, time, argv, returncode, ok, output)
           SELECT t.uuid, m.id, t.time, t.argv, t.returncode, t.ok, t.output
           FROM src.action_attempts t JOIN src.actions a ON a.id = t.action_id
           JOIN main.actions m ON m.device = a.device AND m.action = a.action
             AND m.quarantined_since = a.quarantined_since WHERE t.id > ?""",
        (att_after,),
    )
    conn.execute(
        """UPDATE main.actions SET attempts = (SELECT COUNT(*) FROM main.action_attempts t
                                               WHERE t.action_id = actions.id)
           WHERE id IN (SELECT m.id FROM main.actions m JOIN src.actions a ON m.device = a.device
                        AND m.action = a.action AND m.quarantined_since = a.quarantined_since)"""
    )
    conn.execute(
        """INSERT OR IGNORE INTO main.checkpoints(uuid, checkpoint_id, step, verified, digest, job, time, status,
                                                  detail)
           SELECT uuid, checkpoint_id, step, verified, digest, job, time, status, detail FROM src.checkpoints
           WHERE true"""
    )
    conn.execute(
        """INSERT OR IGNORE INTO main.checkpoint_scrubs(uuid, checkpoint_id, status, tensors, bytes, bad,
                                                        unverified, detail, host, time)
           SELECT uuid, checkpoint_id, status, tensors, bytes, bad, unverified, detail, host, time
           FROM src.checkpoint_scrubs WHERE true"""
    )
    conn.execute(
        """INSERT OR IGNORE INTO main.dcgm_results(uuid, device, host, run, time, category, test, status, warnings,
                                                   dcgm_version, driver)
           SELECT uuid, device, host, run, time, category, test, status, warnings, dcgm_version, driver
           FROM src.dcgm_results WHERE true"""
    )
    replay_quarantine(conn, hist_after)
    return incidents, history


def read_mark(conn: Any, source: str, *, full: bool) -> tuple[dict[str, int], dict[str, str], list[int]]:
    """The output's watermark of input ``source``: ``(after, remembered uuids, scans still open)``; nothing (read
    the input in full) with ``full`` or for an input never merged."""
    mark = (
        None
        if full
        else conn.execute(
            "SELECT scans, incidents, history, decisions, attempts, open_scans, marks FROM main.merge_sources "
            "WHERE source = ?",
            (source,),
        ).fetchone()
    )
    after = dict(zip(WATERMARKED, [int(v) for v in mark[:5]] if mark else (0,) * len(WATERMARKED)))
    return after, json.loads(mark[6]) if mark else {}, json.loads(mark[5]) if mark else []


def check_marks(conn: Any, after: dict[str, int], remembered: dict[str, str]) -> list[str]:
    """Reset (to 0: read in full) every watermark whose row in the input is gone or is another row than the one
    remembered; returns those tables. A watermark without a remembered uuid (from before schema 7) is not trusted
    either."""
    rewound = []
    for table, top in after.items():
        if not top:
            continue
        row = conn.execute(f"SELECT uuid FROM src.{table} WHERE id = ?", (top,)).fetchone()
        if row is None or row[0] != remembered.get(table):
            rewound.append(table)
            after[table] = 0
    return rewound


def remember(conn: Any, source: str, path: str) -> None:
    """The watermark of this input: the highest row of every append-only table and its uuid, and the scans still
    open (running, or interrupted lately)."""
    tops: list[int] = []
    marks: dict[str, str] = {}
    for table in WATERMARKED:
        row = conn.execute(f"SELECT id, uuid FROM src.{table} ORDER BY id DESC LIMIT 1").fetchone()
        tops.append(0 if row is None else int(row[0]))
        if row is not None:
            marks[table] = row[1]
    still_open = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM src.scans WHERE status = 'running' OR (status = 'interrupted' AND "
            "COALESCE(finished_at, started_at) >= ?)",
            (time.time() - _REOPEN_S,),
        )
    ]
    conn.execute(
        "INSERT INTO main.merge_sources(source, path, merged_at, scans, incidents, history, decisions, attempts, "
        "open_scans, marks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(source) DO UPDATE SET "
        "path = excluded.path, merged_at = excluded.merged_at, scans = excluded.scans, "
        "incidents = excluded.incidents, history = excluded.history, decisions = excluded.decisions, "
        "attempts = excluded.attempts, open_scans = excluded.open_scans, marks = excluded.marks",
        (source, path, time.time(), *tops, json.dumps(still_open), json.dumps(marks, sort_keys=True)),
    )


def set_meta(conn: sqlite3.Connection, key: str, value: object) -> None:
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, str(value)),
    )


def replay_quarantine(conn: sqlite3.Connection, history_after: int) -> None:
    """Current state of every device the input's new history names = its latest change in the merged history."""
    rows = conn.execute(
        """SELECT h.device, h.action, h.time, h.by, h.reason FROM main.quarantine_history h
           WHERE h.device IN (SELECT device FROM src.quarantine_history WHERE id > ?)
             AND h.id = (SELECT id FROM main.quarantine_history x WHERE x.device = h.device
                         ORDER BY x.time DESC, x.id DESC LIMIT 1)""",
        (history_after,),
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
