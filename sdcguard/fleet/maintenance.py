"""Merging another store into this one (incrementally), and pruning old scans into daily roll-ups.

**Merge.** Every row that can be merged has a natural key: a scan its ``uuid``, a result ``(scan uuid, seq)``, an
incident, a quarantine change, a policy decision and an action attempt their ``uuid``, an action
``(device, action, quarantined_since)``. A merge takes only what is new in an input since its last merge: the
output remembers, per input (its ``meta.store_id``), the highest row id it took of every append-only table and
the scans that were still open (``running``/``interrupted``); those open scans are taken again, since their rows
still change (a passing row's count grows as the scan goes on). The input is the authority for its own scans'
rows, so taking one again changes nothing: merging the same input twice counts nothing twice, with or without
the watermark (``full=True`` ignores it). A device's quarantine state is replayed from the merged history (the
latest change wins). Each input is merged in one transaction, read through ``ATTACH``, and never written.

**Prune.** Scans that started before the horizon (a UTC midnight) are rolled into per-day, per-device, per-family
counts (``rollups``; the whole fleet's per day in ``rollup_days``; complete scans per day and device in
``scan_rollups``; both also summed over all days in ``rollup_totals`` and ``scan_rollup_totals``, what an all-time
report reads) and their rows deleted, one day per
transaction, so a store killed while pruning is consistent. Every execution is counted once, in a row or in a
roll-up; what is lost is the detail of each old failure and the time resolution below a day. A later merge
skips input scans older than the horizon: they are already in the roll-ups.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from .connection import StoreBase, read_only_uri
from .rows import MergeStats, PruneStats

__all__ = ["StoreMaintenance"]

_DAY_S = 86400.0
_OPEN = "('running', 'interrupted')"
_APPEND_ONLY = {"incidents": "incidents", "history": "quarantine_history", "decisions": "policy_decisions",
                "attempts": "action_attempts"}


class StoreMaintenance(StoreBase):
    """Merge and prune (part of :class:`sdcguard.fleet.store.Store`)."""

    def merge_from(self, path: Path, *, full: bool = False) -> MergeStats:
        """Merge the store at ``path`` (checked by :func:`~.connection.check_merge_input`) into this one."""
        conn = self._conn
        conn.execute("ATTACH DATABASE ? AS src", (read_only_uri(Path(path)),))
        try:
            with self._write():
                return self._merge_attached(str(path), full=full)
        finally:
            conn.execute("DETACH DATABASE src")

    def _merge_attached(self, path: str, *, full: bool) -> MergeStats:
        conn = self._conn
        source = conn.execute("SELECT value FROM src.meta WHERE key = 'store_id'").fetchone()[0]
        mark = None if full else conn.execute(
            "SELECT scans, incidents, history, decisions, attempts, open_scans FROM main.merge_sources "
            "WHERE source = ?", (source,)).fetchone()
        scans_after, inc_after, hist_after, dec_after, att_after = (mark[:5] if mark else (0, 0, 0, 0, 0))
        reopened = json.loads(mark[5]) if mark else []
        horizon = self.pruned_before or float("-inf")
        devices = _merge_devices(conn)
        new_scans, results, skipped = _merge_scans(conn, scans_after, reopened, horizon)
        incidents, history = _merge_appended(conn, inc_after, hist_after, dec_after, att_after)
        _replay_quarantine(conn, hist_after)
        _remember(conn, source, path)
        return MergeStats(source=path, devices=devices, scans=new_scans, results=results, incidents=incidents,
                          quarantine_history=history, skipped_scans=skipped)

    def prune(self, *, before: float) -> PruneStats:
        """Roll every finished scan that started before ``before`` (rounded down to a UTC midnight) into the
        daily roll-ups and delete its rows; returns what was done. Scans still ``running`` are left alone."""
        horizon = math.floor(before / _DAY_S) * _DAY_S
        days = [int(r[0]) for r in self._rows(
            f"SELECT DISTINCT CAST(started_at / {_DAY_S} AS INTEGER) FROM scans WHERE started_at < ? "
            f"AND status NOT IN {_OPEN} ORDER BY 1", (horizon,))]
        scans = results = rollup_rows = 0
        for day in days:
            lo, hi = day * _DAY_S, min((day + 1) * _DAY_S, horizon)
            with self._write() as conn:
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_scans(id INTEGER PRIMARY KEY)")
                conn.execute("DELETE FROM temp.prune_scans")
                conn.execute(
                    f"INSERT INTO temp.prune_scans SELECT id FROM scans WHERE started_at >= ? AND started_at < ? "
                    f"AND status NOT IN {_OPEN}", (lo, hi))
                rollup_rows += conn.execute(
                    f"""INSERT INTO rollups(day, device, family, executions, failures, test_s)
                        SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS d, device, family,
                          TOTAL((attempt = 0) * executions), TOTAL(attempt = 0 AND passed = 0), TOTAL(duration_s)
                        FROM results WHERE scan IN (SELECT id FROM temp.prune_scans) GROUP BY d, device, family
                        ON CONFLICT(day, device, family) DO UPDATE SET
                          executions = executions + excluded.executions, failures = failures + excluded.failures,
                          test_s = test_s + excluded.test_s""").rowcount
                conn.execute(
                    f"""INSERT INTO rollup_days(day, executions, failures, test_s)
                        SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS d, TOTAL((attempt = 0) * executions),
                          TOTAL(attempt = 0 AND passed = 0), TOTAL(duration_s)
                        FROM results WHERE scan IN (SELECT id FROM temp.prune_scans) GROUP BY d
                        ON CONFLICT(day) DO UPDATE SET
                          executions = executions + excluded.executions, failures = failures + excluded.failures,
                          test_s = test_s + excluded.test_s""")
                conn.execute(
                    """INSERT INTO rollup_totals(device, family, executions, failures, test_s)
                       SELECT device, family, TOTAL((attempt = 0) * executions), TOTAL(attempt = 0 AND passed = 0),
                         TOTAL(duration_s)
                       FROM results WHERE scan IN (SELECT id FROM temp.prune_scans) GROUP BY device, family
                       ON CONFLICT(device, family) DO UPDATE SET
                         executions = executions + excluded.executions, failures = failures + excluded.failures,
                         test_s = test_s + excluded.test_s""")
                conn.execute(
                    f"""INSERT INTO scan_rollups(day, device, complete, last_complete)
                        SELECT CAST(started_at / {_DAY_S} AS INTEGER) AS d, device, TOTAL(status = 'complete'),
                          MAX(CASE WHEN status = 'complete' THEN COALESCE(finished_at, started_at) END)
                        FROM scans WHERE id IN (SELECT id FROM temp.prune_scans) GROUP BY d, device
                        ON CONFLICT(day, device) DO UPDATE SET complete = complete + excluded.complete,
                          last_complete = MAX(COALESCE(last_complete, excluded.last_complete),
                                              COALESCE(excluded.last_complete, last_complete))""")
                conn.execute(
                    """INSERT INTO scan_rollup_totals(device, complete, last_complete)
                       SELECT device, TOTAL(status = 'complete'),
                         MAX(CASE WHEN status = 'complete' THEN COALESCE(finished_at, started_at) END)
                       FROM scans WHERE id IN (SELECT id FROM temp.prune_scans) GROUP BY device
                       ON CONFLICT(device) DO UPDATE SET complete = complete + excluded.complete,
                         last_complete = MAX(COALESCE(last_complete, excluded.last_complete),
                                             COALESCE(excluded.last_complete, last_complete))""")
                results += conn.execute(
                    "DELETE FROM results WHERE scan IN (SELECT id FROM temp.prune_scans)").rowcount
                scans += conn.execute("DELETE FROM scans WHERE id IN (SELECT id FROM temp.prune_scans)").rowcount
                last = conn.execute("SELECT MAX(day) FROM rollups").fetchone()[0]
                if last is not None:
                    _set_meta(conn, "rollup_last_day", int(last))
                _set_meta(conn, "pruned_before", max(hi, float(self._meta("pruned_before") or hi)))
        if not days:
            with self._write() as conn:
                _set_meta(conn, "pruned_before", max(horizon, float(self._meta("pruned_before") or horizon)))
        return PruneStats(before=horizon, scans=scans, results=results, rollup_rows=rollup_rows)

    def vacuum(self) -> None:
        """Rewrite the file without its free pages (after a prune or a migration that folded many rows)."""
        self._retry(lambda: self._conn.execute("VACUUM"))


def _merge_devices(conn: Any) -> int:
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
             last_seen = MAX(devices.last_seen, excluded.last_seen)""")
    return int(conn.execute("SELECT COUNT(*) FROM main.devices").fetchone()[0]) - int(before_devices)


def _merge_scans(conn: Any, scans_after: int, reopened: list[int], horizon: float) -> tuple[int, int, int]:
    """New scans and those still open at the last merge, with their rows; ``(new scans, new rows, skipped)``."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS merge_scans(src_id INTEGER PRIMARY KEY, uuid TEXT, dst_id INTEGER)")
    conn.execute("DELETE FROM temp.merge_scans")
    conn.execute(
        "INSERT INTO temp.merge_scans(src_id, uuid) SELECT id, uuid FROM src.scans "
        "WHERE (id > ? OR id IN (SELECT value FROM json_each(?)))",
        (scans_after, json.dumps(reopened)),
    )
    # Scans older than our retention horizon are in our roll-ups already, except those we still hold open
    # (prune leaves a running scan alone): those take their final state from the input as usual.
    old = ("src_id IN (SELECT id FROM src.scans WHERE started_at < ?) "
           f"AND uuid NOT IN (SELECT uuid FROM main.scans WHERE status IN {_OPEN})")
    skipped = conn.execute(f"SELECT COUNT(*) FROM temp.merge_scans WHERE {old}", (horizon,)).fetchone()[0]
    conn.execute(f"DELETE FROM temp.merge_scans WHERE {old}", (horizon,))
    new_scans = conn.execute(
        "SELECT COUNT(*) FROM temp.merge_scans m WHERE NOT EXISTS (SELECT 1 FROM main.scans s WHERE s.uuid = m.uuid)"
    ).fetchone()[0]
    conn.execute(
        """INSERT INTO main.scans(uuid, device, host, started_at, finished_at, budget_s, status, meta, total)
           SELECT s.uuid, s.device, s.host, s.started_at, s.finished_at, s.budget_s, s.status, s.meta, s.total
           FROM src.scans s JOIN temp.merge_scans m ON m.src_id = s.id WHERE true
           ON CONFLICT(uuid) DO UPDATE SET status = excluded.status, finished_at = excluded.finished_at,
             total = excluded.total, meta = excluded.meta
           WHERE scans.status IN ('running', 'interrupted') AND excluded.status NOT IN ('running', 'interrupted')""")
    conn.execute("UPDATE temp.merge_scans SET dst_id = (SELECT id FROM main.scans s WHERE s.uuid = merge_scans.uuid)")
    before_results = conn.execute(
        "SELECT COUNT(*) FROM main.results WHERE scan IN (SELECT dst_id FROM temp.merge_scans)").fetchone()[0]
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
             last_started_at = excluded.last_started_at, sticky = excluded.sticky, detail = excluded.detail""")
    results = conn.execute(
        "SELECT COUNT(*) FROM main.results WHERE scan IN (SELECT dst_id FROM temp.merge_scans)"
    ).fetchone()[0] - before_results
    # Scan counters follow the merged rows (first attempts, like the rates).
    conn.execute(
        """UPDATE main.scans SET
             executions = (SELECT TOTAL(r.executions) FROM main.results r WHERE r.scan = scans.id AND r.attempt = 0),
             failures = (SELECT COUNT(*) FROM main.results r WHERE r.scan = scans.id AND r.attempt = 0
                         AND r.passed = 0)
           WHERE id IN (SELECT dst_id FROM temp.merge_scans)""")
    return new_scans, results, skipped


def _merge_appended(conn: Any, inc_after: int, hist_after: int, dec_after: int, att_after: int) -> tuple[int, int]:
    """Pass digests, incidents, quarantine history, decisions, actions and their attempts past the watermark;
    ``(new incidents, new history rows)``."""
    conn.execute(
        """INSERT INTO main.pass_digests(case_id, digest, first_seen)
           SELECT case_id, digest, first_seen FROM src.pass_digests WHERE true
           ON CONFLICT(case_id, digest) DO UPDATE SET first_seen = MIN(pass_digests.first_seen, excluded.first_seen)""")
    incidents = conn.execute(
        """INSERT OR IGNORE INTO main.incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail,
             parameter, sticky, job, time, record)
           SELECT uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, sticky, job, time,
             record FROM src.incidents WHERE id > ?""", (inc_after,)).rowcount
    conn.execute(
        """INSERT OR IGNORE INTO main.incident_devices(incident, device)
           SELECT m.id, d.device FROM src.incident_devices d JOIN src.incidents i ON i.id = d.incident
           JOIN main.incidents m ON m.uuid = i.uuid WHERE i.id > ?""", (inc_after,))
    history = conn.execute(
        """INSERT OR IGNORE INTO main.quarantine_history(uuid, device, action, time, by, reason)
           SELECT uuid, device, action, time, by, reason FROM src.quarantine_history WHERE id > ?""",
        (hist_after,)).rowcount
    conn.execute(
        """INSERT OR IGNORE INTO main.policy_decisions(uuid, time, device, decision, reason)
           SELECT uuid, time, device, decision, reason FROM src.policy_decisions WHERE id > ?""", (dec_after,))
    conn.execute(
        """INSERT INTO main.actions(uuid, device, action, quarantined_since, created, done, attempts)
           SELECT uuid, device, action, quarantined_since, created, done, attempts FROM src.actions WHERE true
           ON CONFLICT(device, action, quarantined_since) DO UPDATE SET done = MAX(actions.done, excluded.done)
           ON CONFLICT(uuid) DO UPDATE SET done = MAX(actions.done, excluded.done)""")
    conn.execute(
        """INSERT OR IGNORE INTO main.action_attempts(uuid, action_id, time, argv, returncode, ok, output)
           SELECT t.uuid, m.id, t.time, t.argv, t.returncode, t.ok, t.output
           FROM src.action_attempts t JOIN src.actions a ON a.id = t.action_id
           JOIN main.actions m ON m.device = a.device AND m.action = a.action
             AND m.quarantined_since = a.quarantined_since WHERE t.id > ?""", (att_after,))
    conn.execute(
        """UPDATE main.actions SET attempts = (SELECT COUNT(*) FROM main.action_attempts t
                                               WHERE t.action_id = actions.id)
           WHERE id IN (SELECT m.id FROM main.actions m JOIN src.actions a ON m.device = a.device
                        AND m.action = a.action AND m.quarantined_since = a.quarantined_since)""")
    conn.execute(
        """INSERT OR IGNORE INTO main.checkpoints(uuid, checkpoint_id, step, verified, digest, job, time, status,
                                                  detail)
           SELECT uuid, checkpoint_id, step, verified, digest, job, time, status, detail FROM src.checkpoints
           WHERE true""")
    conn.execute(
        """INSERT OR IGNORE INTO main.checkpoint_scrubs(uuid, checkpoint_id, status, tensors, bytes, bad, detail,
                                                        host, time)
           SELECT uuid, checkpoint_id, status, tensors, bytes, bad, detail, host, time FROM src.checkpoint_scrubs
           WHERE true""")
    _replay_quarantine(conn, hist_after)
    return incidents, history


def _remember(conn: Any, source: str, path: str) -> None:
    """The watermark of this input: the highest row of every append-only table, and the scans still open."""
    tops = [conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM src.{t}").fetchone()[0]
            for t in ("scans", *_APPEND_ONLY.values())]
    still_open = [r[0] for r in conn.execute(f"SELECT id FROM src.scans WHERE status IN {_OPEN}")]
    conn.execute(
        "INSERT INTO main.merge_sources(source, path, merged_at, scans, incidents, history, decisions, attempts, "
        "open_scans) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(source) DO UPDATE SET path = excluded.path, "
        "merged_at = excluded.merged_at, scans = excluded.scans, incidents = excluded.incidents, "
        "history = excluded.history, decisions = excluded.decisions, attempts = excluded.attempts, "
        "open_scans = excluded.open_scans",
        (source, path, time.time(), *tops, json.dumps(still_open)),
    )


def _set_meta(conn: object, key: str, value: object) -> None:
    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",  # type: ignore[attr-defined]
                 (key, str(value)))


def _replay_quarantine(conn: object, history_after: int) -> None:
    """Current state of every device the input's new history names = its latest change in the merged history."""
    rows = conn.execute(  # type: ignore[attr-defined]
        """SELECT h.device, h.action, h.time, h.by, h.reason FROM main.quarantine_history h
           WHERE h.device IN (SELECT device FROM src.quarantine_history WHERE id > ?)
             AND h.id = (SELECT id FROM main.quarantine_history x WHERE x.device = h.device
                         ORDER BY x.time DESC, x.id DESC LIMIT 1)""", (history_after,)
    ).fetchall()
    for device, action, t, by, reason in rows:
        if action == "probation_passed":
            conn.execute("DELETE FROM main.quarantine WHERE device = ?", (device,))  # type: ignore[attr-defined]
            continue
        state = "quarantined" if action == "quarantine" else "probation"
        conn.execute(  # type: ignore[attr-defined]
            "INSERT INTO main.quarantine(device, state, since, reason, by) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(device) DO UPDATE SET state = excluded.state, since = excluded.since, "
            "reason = excluded.reason, by = excluded.by",
            (device, state, t, reason, by),
        )
