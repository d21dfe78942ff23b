"""The record's tables, both backends' steps: devices, scans, their results, incidents, the quarantine and its
history, policy decisions and actions (version 1), the indexes the report reads (2, 3), the store at fleet scale
(4: one row per scan and case for passing first attempts, roll-ups of pruned days, merge watermarks, pass
digests, every incident's whole record), merge marks that notice an input going backwards (7) and devices'
versions (13). Listed, with every other step, in :mod:`.migrations`.

The file is marked as an sdcguard store (``PRAGMA application_id``, bytes 68-71 of the header) and its schema
version lives in ``PRAGMA user_version`` (bytes 60-63), so :mod:`..sqlite.files` reads both from the header
*before* SQLite touches the file: a newer or foreign file is refused byte-for-byte untouched.

Natural keys (``scans.uuid``, ``results(scan, seq)``, ``incidents.uuid``, ``*.uuid``) make ``sdcguard merge``
idempotent: merging the same per-node store twice inserts nothing the second time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

__all__ = [
    "SQLITE_MAGIC",
    "APPLICATION_ID",
    "MIN_EXECUTIONS",
    "COUNTED_SCAN",
    "script",
    "v1",
    "v2",
    "v3",
    "v4",
    "v7",
    "v13",
    "postgres_v13",
]

SQLITE_MAGIC = b"SQLite format 3\x00"
APPLICATION_ID = 0x5344_4347  # "SDCG"
SCHEMA_VERSION = 14

MIN_EXECUTIONS = 1
"""The least work a scan must do to count: first-attempt executions of golden cases it recorded."""
COUNTED_SCAN = f"status = 'complete' AND executions >= {MIN_EXECUTIONS}"
"""A scan that counts as a complete scan (scan counts, ``last_scan``, the clean scans that end a probation): it ran
to its end *and* tested something. A scan that ran nothing (a budget shorter than any case) tested nothing."""

_V1 = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT,
    serial TEXT,
    pci_bus_id TEXT,
    idx INTEGER,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS scans (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    device TEXT NOT NULL,
    host TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    budget_s REAL,
    status TEXT NOT NULL CHECK (status IN ('running','complete','preempted','interrupted','error')),
    executions INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS scans_device ON scans(device, status, started_at);
CREATE INDEX IF NOT EXISTS scans_status ON scans(status, started_at);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    scan INTEGER NOT NULL REFERENCES scans(id),
    seq INTEGER NOT NULL,
    device TEXT NOT NULL,
    case_id TEXT NOT NULL,
    family TEXT NOT NULL,
    seed INTEGER NOT NULL,
    passed INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    started_at REAL NOT NULL,
    output_digest TEXT,
    mismatches INTEGER NOT NULL DEFAULT 0,
    element INTEGER,
    expected TEXT,
    actual TEXT,
    xor_mask TEXT,
    location TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    sticky INTEGER,
    detail TEXT NOT NULL DEFAULT '{}',
    UNIQUE (scan, seq)
);
CREATE INDEX IF NOT EXISTS results_rates ON results(device, family, started_at, attempt, passed, duration_s);
CREATE INDEX IF NOT EXISTS results_failures ON results(started_at, case_id, output_digest, device)
    WHERE passed = 0;
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    step INTEGER NOT NULL,
    suspect_ranks TEXT NOT NULL,
    device TEXT,
    devices TEXT NOT NULL,
    hosts TEXT NOT NULL,
    detail TEXT NOT NULL,
    parameter TEXT,
    sticky INTEGER,
    job TEXT,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_time ON incidents(time);
-- One row per device an incident names (Incident.device and every Incident.devices entry).
CREATE TABLE IF NOT EXISTS incident_devices (
    incident INTEGER NOT NULL REFERENCES incidents(id),
    device TEXT NOT NULL,
    PRIMARY KEY (incident, device)
);
CREATE INDEX IF NOT EXISTS incident_devices_device ON incident_devices(device);
-- Current state only; healthy devices have no row. The history below keeps every change.
CREATE TABLE IF NOT EXISTS quarantine (
    device TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('quarantined','probation')),
    since REAL NOT NULL,
    reason TEXT NOT NULL,
    by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine_history (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    device TEXT NOT NULL,
    action TEXT NOT NULL CHECK (action IN ('quarantine','release','probation_passed')),
    time REAL NOT NULL,
    by TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS quarantine_history_device ON quarantine_history(device, time);
CREATE TABLE IF NOT EXISTS policy_decisions (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    time REAL NOT NULL,
    device TEXT,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS policy_decisions_time ON policy_decisions(time);
-- One row per (quarantine event, action template); done = 0 rows are retried on the next policy run.
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    device TEXT NOT NULL,
    action TEXT NOT NULL,
    quarantined_since REAL NOT NULL,
    created REAL NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    UNIQUE (device, action, quarantined_since)
);
CREATE INDEX IF NOT EXISTS actions_pending ON actions(done);
CREATE TABLE IF NOT EXISTS action_attempts (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    action_id INTEGER NOT NULL REFERENCES actions(id),
    time REAL NOT NULL,
    argv TEXT NOT NULL,
    returncode INTEGER,
    ok INTEGER NOT NULL,
    output TEXT NOT NULL
);
"""


# Version 2: leaner indexes for the report. The GROUP BY device, family reads only ``results_rates``, in its
# order (no sort, no table); failures and retests are rare, so rates, the policy and the circuit breaker read
# them through small partial indexes instead of evaluating an expression over every row.
_V2 = """
DROP INDEX IF EXISTS results_rates;
CREATE INDEX results_rates ON results(device, family, started_at, duration_s);
DROP INDEX IF EXISTS results_failures;
CREATE INDEX results_failures ON results(started_at, case_id, output_digest, device, family, attempt)
    WHERE passed = 0;
CREATE INDEX IF NOT EXISTS results_retests ON results(started_at, device, family) WHERE attempt > 0;
"""


def script(sql: str) -> Callable[[sqlite3.Connection], None]:
    """A migration step that runs ``sql``, statement by statement, inside the caller's transaction."""

    def run(conn: sqlite3.Connection) -> None:
        # Statement by statement: executescript() would COMMIT the caller's transaction.
        for statement in sql.split(";\n"):
            if statement.strip():
                conn.execute(statement)

    return run


# Version 3: a result row may stand for several identical passing executions (``CaseResult.executions``; the fleet
# simulator records a day's passing executions of one case as one row). Rates sum the column; it joins the
# covering index so the report's big scan stays index-only.
_V3 = """
ALTER TABLE results ADD COLUMN executions INTEGER NOT NULL DEFAULT 1;
DROP INDEX IF EXISTS results_rates;
CREATE INDEX results_rates ON results(device, family, started_at, duration_s, executions);
"""


# Version 4: the store grows with scans and cases, not with executions.
# - Passing first attempts of one case in one scan are one row (``executions``, summed ``duration_s``, first
#   ``started_at`` and ``last_started_at``); existing rows are folded together here, which changes no count, rate,
#   bound or testing time. Failed executions and retests stay one row each.
# - ``scans.total``: executions (retests included) the scanner says it produced, set with the final status, so a
#   complete scan with missing results can be told; ``scans.executions``/``failures`` count first attempts only,
#   like the rates.
# - ``rollups``/``scan_rollups``: what ``sdcguard prune`` keeps of scans older than the retention horizon
#   (per UTC day, device and family: a window reads only its days); ``rollup_totals``/``scan_rollup_totals`` the
#   same summed over every day (what an all-time report reads); ``meta.pruned_before`` is that horizon.
# - ``merge_sources``: per merged input (its ``meta.store_id``), how far the last merge got.
# - ``pass_digests``: the output digests each case passed with (one per golden file in use): a wrong output
#   equal to one of them is a device computing what another golden file expects.
# - ``incidents.record``: the whole Incident as JSON, so an optional field added later needs no new column.
_V4 = """
ALTER TABLE results ADD COLUMN last_started_at REAL;
ALTER TABLE scans ADD COLUMN total INTEGER;
ALTER TABLE incidents ADD COLUMN record TEXT;
UPDATE incidents SET record = json_object('kind', kind, 'step', step, 'suspect_ranks', json(suspect_ranks),
    'device', device, 'detail', detail, 'devices', json(devices), 'hosts', json(hosts), 'parameter', parameter,
    'sticky', CASE WHEN sticky IS NULL THEN NULL WHEN sticky THEN json('true') ELSE json('false') END,
    'job', job, 'time', time);
CREATE TEMP TABLE _fold AS SELECT scan, case_id, MIN(id) AS keep, TOTAL(executions) AS n, TOTAL(duration_s) AS s,
    MIN(started_at) AS first, MAX(COALESCE(last_started_at, started_at)) AS last
    FROM results WHERE passed = 1 AND attempt = 0 GROUP BY scan, case_id HAVING COUNT(*) > 1;
CREATE UNIQUE INDEX temp._fold_keep ON _fold(keep);
CREATE INDEX temp._fold_key ON _fold(scan, case_id);
UPDATE results SET executions = (SELECT CAST(n AS INTEGER) FROM _fold WHERE keep = results.id),
    duration_s = (SELECT s FROM _fold WHERE keep = results.id),
    started_at = (SELECT first FROM _fold WHERE keep = results.id),
    last_started_at = (SELECT last FROM _fold WHERE keep = results.id)
    WHERE id IN (SELECT keep FROM _fold);
DELETE FROM results WHERE passed = 1 AND attempt = 0 AND id NOT IN (SELECT keep FROM _fold)
    AND EXISTS (SELECT 1 FROM _fold f WHERE f.scan = results.scan AND f.case_id = results.case_id);
DROP TABLE _fold;
UPDATE scans SET
    executions = (SELECT TOTAL(executions) FROM results r WHERE r.scan = scans.id AND r.attempt = 0),
    failures = (SELECT COUNT(*) FROM results r WHERE r.scan = scans.id AND r.attempt = 0 AND r.passed = 0),
    total = CASE WHEN status = 'running' THEN NULL
        ELSE (SELECT TOTAL(executions) FROM results r WHERE r.scan = scans.id) END;
CREATE INDEX IF NOT EXISTS results_cases ON results(case_id, started_at, device);
CREATE TABLE IF NOT EXISTS pass_digests (
    case_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    first_seen REAL NOT NULL,
    PRIMARY KEY (case_id, digest)
) WITHOUT ROWID;
INSERT OR REPLACE INTO pass_digests(case_id, digest, first_seen)
    SELECT case_id, output_digest, MIN(started_at) FROM results
    WHERE passed = 1 AND attempt = 0 AND output_digest IS NOT NULL GROUP BY case_id, output_digest;
CREATE TABLE IF NOT EXISTS rollups (
    day INTEGER NOT NULL,
    device TEXT NOT NULL,
    family TEXT NOT NULL,
    executions INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    test_s REAL NOT NULL,
    PRIMARY KEY (day, device, family)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup_totals (
    device TEXT NOT NULL,
    family TEXT NOT NULL,
    executions INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    test_s REAL NOT NULL,
    PRIMARY KEY (device, family)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scan_rollups (
    day INTEGER NOT NULL,
    device TEXT NOT NULL,
    complete INTEGER NOT NULL,
    last_complete REAL,
    PRIMARY KEY (day, device)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scan_rollup_totals (
    device TEXT PRIMARY KEY,
    complete INTEGER NOT NULL,
    last_complete REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS merge_sources (
    source TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    merged_at REAL NOT NULL,
    scans INTEGER NOT NULL,
    incidents INTEGER NOT NULL,
    history INTEGER NOT NULL,
    decisions INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    open_scans TEXT NOT NULL
);
INSERT OR IGNORE INTO meta(key, value) VALUES ('store_id', lower(hex(randomblob(16))))
"""


# Version 7: merge watermarks that notice an input going backwards. ``scans.id`` is an INTEGER PRIMARY KEY
# without AUTOINCREMENT, so SQLite reuses ids once a node's newest scans are pruned, and a node store restored
# from an older backup reuses them too: "take every row past id N" then silently skips the new rows. Each
# watermark now remembers the uuid of the row at its id (``marks``: table -> uuid); a merge that finds another row
# there, or none, reads that table of the input in full (natural keys keep it from counting anything twice). A
# watermark from before this version has no uuid: the first merge after the upgrade reads each input in full
# once, which also recovers scans an earlier merge skipped.
def v7(conn: sqlite3.Connection) -> None:
    columns = {r[1] for r in conn.execute("PRAGMA table_info(merge_sources)")}
    if "marks" not in columns:  # (a store stamped back to an older version by hand still has it)
        conn.execute("ALTER TABLE merge_sources ADD COLUMN marks TEXT NOT NULL DEFAULT '{}'")


def v13(conn: sqlite3.Connection) -> None:
    """Each device's version (what moves it: :data:`~..core.ADD_ONE`) on SQLite: the column, every device at 0.
    Idempotent, as every migration: a store stamped older than it is may have the column already."""
    if not any(r[1] == "version" for r in conn.execute("PRAGMA table_info(devices)").fetchall()):
        conn.execute("ALTER TABLE devices ADD COLUMN version INTEGER NOT NULL DEFAULT 0")


def postgres_v13(conn: Any) -> None:
    """Each device's version on a server: a column with a constant default, added without rewriting the table."""
    conn.raw.execute("ALTER TABLE devices ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0")


v1 = script(_V1)
v2 = script(_V2)
v3 = script(_V3)
v4 = script(_V4)
