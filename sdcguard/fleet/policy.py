"""The quarantine policy: which devices to take out of service, and when the suite itself is suspect.

:func:`apply_policy` reads the store with a handful of SQL aggregations (failures are rare and read through a
partial index, so a run over a 10,000-device fleet costs little), decides, records every decision with its reason
in ``policy_decisions`` (and each quarantine in ``quarantine_history``) in one transaction, then runs the action
templates for quarantined devices whose actions have not succeeded yet.

Order of evaluation in one run:

1. Stale ``running`` scans are reaped (``interrupted``).
2. Circuit breaker: the same wrong ``output_digest`` for one case on ``breaker_same_digest_devices`` or more
   devices, or more than ``breaker_share`` of the devices that ran one case failing it (and at least
   ``breaker_min_devices`` of them), within ``breaker_window_s``. Identical wrong answers on different hardware
   point at the suite or the software: nobody is quarantined in that run, and the outcome says why.
3. Otherwise a device is quarantined on a sticky failure (a failure reproduced on retest), on ``rate_low`` above
   ``rate_threshold`` at ``confidence``, or on ``incident_threshold`` training incidents naming it in the window.
4. Probation (after a manual release): any failed execution since the release re-quarantines the device;
   ``probation_clean_scans`` complete scans without a failure end probation.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid as _uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .actions import ActionTemplate, run_action
from .rates import clopper_pearson_arrays
from .store import DEFAULT_WINDOW_S, Store, _end_probation, _quarantine

__all__ = ["QuarantinePolicy", "PolicyOutcome", "Decision", "apply_policy"]


@dataclass(frozen=True, kw_only=True)
class QuarantinePolicy:
    """When to quarantine a device. Defaults suit a fleet where healthy hardware never fails a golden case."""

    window_s: float = DEFAULT_WINDOW_S
    """Look-back window for rates and incidents (7 days)."""
    confidence: float = 0.95
    """Confidence of the one-sided Clopper–Pearson lower bound compared with ``rate_threshold``."""
    rate_threshold: float = 1e-4
    """Quarantine when ``rate_low`` exceeds this (one failure in 10,000 executions). The lower bound sits below
    the true rate, so the threshold must sit well below the rates worth catching: at 1e-3 a device failing 1.2e-3
    of its executions stayed under it for weeks in ``benchmarks/fleet_policy.py``, at 1e-4 every device at or above
    1e-3 was caught within 7 days, and healthy devices (rare transients) still need two failures within ~3,500
    executions to cross it."""
    quarantine_on_sticky: bool = True
    """Quarantine on any failure reproduced on retest (``CaseResult.sticky``)."""
    incident_threshold: int = 2
    """Quarantine a device named by at least this many training incidents in the window (0: off)."""
    breaker_window_s: float = 86400.0
    """Window of the circuit breaker (1 day): a suite problem older than that no longer blocks quarantines."""
    breaker_same_digest_devices: int = 2
    """Trip when this many devices produced the same wrong output (digest) for one case."""
    breaker_share: float = 0.25
    """Trip when more than this share of the devices that ran one case failed it ..."""
    breaker_min_devices: int = 3
    """... and at least this many did (so one bad core of a 4-core host does not trip it)."""
    probation_clean_scans: int = 3
    """Complete scans without a failure that end a probation after a manual release."""
    reap_grace_s: float = 600.0
    """A ``running`` scan older than its budget plus this is marked ``interrupted``."""

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.breaker_window_s <= 0:
            raise ValueError("windows must be > 0 seconds")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if not 0 <= self.rate_threshold < 1:
            raise ValueError(f"rate_threshold must be in [0, 1), got {self.rate_threshold}")
        if not 0 < self.breaker_share <= 1:
            raise ValueError(f"breaker_share must be in (0, 1], got {self.breaker_share}")
        if self.breaker_same_digest_devices < 2:
            raise ValueError("breaker_same_digest_devices must be >= 2")
        if self.incident_threshold < 0 or self.probation_clean_scans < 0 or self.breaker_min_devices < 1:
            raise ValueError("incident_threshold, probation_clean_scans must be >= 0, breaker_min_devices >= 1")


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One decision of a policy run, as recorded in ``policy_decisions``."""

    device: str | None
    decision: str
    """``quarantine``, ``breaker``, ``probation_passed``, ``action_failed``, ``action_ok``."""
    reason: str


@dataclass(kw_only=True)
class PolicyOutcome:
    """What one :func:`apply_policy` run decided and did."""

    quarantined: list[str] = field(default_factory=list)
    """Devices quarantined by this run."""
    breaker_tripped: bool = False
    reasons: list[str] = field(default_factory=list)
    """One sentence per decision (and why the breaker tripped)."""
    released: list[str] = field(default_factory=list)
    """Devices whose probation ended in this run."""
    decisions: list[Decision] = field(default_factory=list)
    actions_ok: list[tuple[str, str]] = field(default_factory=list)
    """``(device, action name)`` that succeeded in this run."""
    actions_failed: list[tuple[str, str]] = field(default_factory=list)
    """``(device, action name)`` that failed in this run (retried next run)."""
    reaped: int = 0
    """Stale ``running`` scans marked ``interrupted``."""


def _scope(devices: Sequence[str] | None) -> tuple[str, list[str]]:
    """SQL ``AND device IN (...)`` for an optional device list (one JSON parameter, any length)."""
    if devices is None:
        return "", []
    return " AND device IN (SELECT value FROM json_each(?))", [json.dumps(list(devices))]


def _breaker(store: Store, policy: QuarantinePolicy, t: float) -> list[str]:
    since = t - policy.breaker_window_s
    why: list[str] = []
    for case, digest, n in store._conn.execute(
        "SELECT case_id, output_digest, COUNT(DISTINCT device) FROM results WHERE passed = 0 AND started_at >= ? "
        "AND output_digest IS NOT NULL GROUP BY case_id, output_digest HAVING COUNT(DISTINCT device) >= ?",
        (since, policy.breaker_same_digest_devices),
    ):
        why.append(
            f"circuit breaker: case {case} gave the same wrong output (digest {digest[:12]}) on {n} devices: "
            "the suite or the software is suspect, not the hardware; nobody quarantined"
        )
    failing = store._conn.execute(
        "SELECT case_id, COUNT(DISTINCT device) FROM results WHERE passed = 0 AND started_at >= ? GROUP BY case_id "
        "HAVING COUNT(DISTINCT device) >= ?",
        (since, policy.breaker_min_devices),
    ).fetchall()
    for case, bad in failing:
        ran = store.scalar(
            "SELECT COUNT(DISTINCT device) FROM results WHERE case_id = ? AND started_at >= ?", (case, since)
        )
        if ran and bad / ran > policy.breaker_share:
            why.append(
                f"circuit breaker: {bad} of {ran} devices failed case {case} (more than "
                f"{policy.breaker_share:.0%}): the suite or the software is suspect; nobody quarantined"
            )
    return why


def _mark_suite_suspects(store: Store, policy: QuarantinePolicy, since: float) -> str:
    """Fill the temporary table ``_suite_suspect`` and return the SQL condition "this failed result is evidence
    against its device".

    A failure that the circuit breaker would blame on the suite (the same wrong output on several devices, or a
    case failed by too large a share of the devices that ran it on one day) is never evidence against a device,
    even after the breaker's own window has passed: otherwise a bad golden file rolled out yesterday quarantines
    the whole fleet tomorrow, when its failures are still inside the rate window.
    """
    conn = store._conn
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _suite_suspect(case_id TEXT, digest TEXT, day INTEGER)")
    conn.execute("DELETE FROM _suite_suspect")
    conn.execute(
        "INSERT INTO _suite_suspect(case_id, digest, day) SELECT case_id, output_digest, NULL FROM results "
        "WHERE passed = 0 AND started_at >= ? AND output_digest IS NOT NULL GROUP BY case_id, output_digest "
        "HAVING COUNT(DISTINCT device) >= ?",
        (since, policy.breaker_same_digest_devices),
    )
    day = f"CAST(started_at / {policy.breaker_window_s!r} AS INTEGER)"
    conn.execute(
        f"INSERT INTO _suite_suspect(case_id, digest, day) SELECT case_id, NULL, {day} AS d FROM results "
        "WHERE started_at >= ? GROUP BY case_id, d "
        "HAVING COUNT(DISTINCT CASE WHEN passed = 0 THEN device END) >= ? "
        "AND COUNT(DISTINCT CASE WHEN passed = 0 THEN device END) > ? * COUNT(DISTINCT device)",
        (since, policy.breaker_min_devices, policy.breaker_share),
    )
    if conn.execute("SELECT COUNT(*) FROM _suite_suspect").fetchone()[0] == 0:
        return "1"  # nothing suspect: keep the queries on their indexes
    return (
        "NOT EXISTS (SELECT 1 FROM _suite_suspect s WHERE s.case_id = results.case_id AND "
        f"(s.digest = results.output_digest OR s.day = {day}))"
    )


def _candidates(store: Store, policy: QuarantinePolicy, t: float, devices: Sequence[str] | None) -> dict[str, str]:
    """``device -> reason`` for every not-yet-quarantined device the rules name."""
    since = t - policy.window_s
    evidence = _mark_suite_suspects(store, policy, min(since, t - policy.breaker_window_s))
    scope, sp = _scope(devices)
    quarantined = {r[0] for r in store._conn.execute("SELECT device FROM quarantine WHERE state = 'quarantined'")}
    probation = {
        r[0]: r[1] for r in store._conn.execute("SELECT device, since FROM quarantine WHERE state = 'probation'")
    }
    found: dict[str, str] = {}

    def add(device: str, reason: str) -> None:
        if device not in quarantined and device not in found:
            found[device] = reason

    if policy.quarantine_on_sticky:
        for dev, case in store._conn.execute(
            "SELECT device, MIN(case_id) FROM results WHERE passed = 0 AND started_at >= ? AND sticky = 1"
            f" AND {evidence}{scope} GROUP BY device",
            [since, *sp],
        ):
            add(dev, f"sticky failure: case {case} failed and the failure reproduced on retest")
    # Rates: only devices with a failure can have rate_low > 0; aggregate just those (covering index).
    failing = [
        r[0]
        for r in store._conn.execute(
            f"SELECT DISTINCT device FROM results WHERE passed = 0 AND started_at >= ? AND {evidence}{scope}",
            [since, *sp],
        )
    ]
    if failing:
        rows = store._conn.execute(
            f"SELECT device, SUM((attempt = 0) * executions), SUM(attempt = 0 AND passed = 0 AND {evidence}) FROM results "
            "WHERE device IN (SELECT value FROM json_each(?)) AND started_at >= ? GROUP BY device",
            (json.dumps(failing), since),
        ).fetchall()
        n = np.array([r[1] for r in rows], dtype=np.int64)
        k = np.array([r[2] for r in rows], dtype=np.int64)
        low, _ = clopper_pearson_arrays(k, n, policy.confidence)
        for (dev, ni, ki), lo in zip(rows, low.tolist()):
            if lo > policy.rate_threshold:
                add(
                    dev,
                    f"failure rate {ki}/{ni}: lower {policy.confidence:.0%} bound {lo:.3g} exceeds threshold "
                    f"{policy.rate_threshold:.3g}",
                )
    if policy.incident_threshold > 0:
        for dev, count in store._conn.execute(
            "SELECT d.device, COUNT(*) FROM incident_devices d JOIN incidents i ON i.id = d.incident "
            f"WHERE i.time >= ?{scope.replace('device', 'd.device')} GROUP BY d.device HAVING COUNT(*) >= ?",
            [since, *sp, policy.incident_threshold],
        ):
            add(dev, f"{count} training incidents named it in the last {policy.window_s / 86400:g} days")
    # Probation: any failure since the release brings the device back into quarantine.
    for dev, released_at in probation.items():
        if devices is not None and dev not in devices:
            continue
        case = store.scalar(
            f"SELECT case_id FROM results WHERE passed = 0 AND started_at >= ? AND device = ? AND {evidence} LIMIT 1",
            (released_at, dev),
        )
        if case is not None:
            found[dev] = f"failed case {case} while on probation after a manual release"
    return found


def _probation_passed(store: Store, policy: QuarantinePolicy, devices: Sequence[str] | None) -> dict[str, int]:
    scope, sp = _scope(devices)
    rows = store._conn.execute(
        "SELECT q.device, COUNT(s.id) FROM quarantine q JOIN scans s ON s.device = q.device "
        "AND s.started_at >= q.since AND s.status = 'complete' AND s.failures = 0 "
        f"WHERE q.state = 'probation'{scope.replace('device', 'q.device')} GROUP BY q.device",
        sp,
    ).fetchall()
    return {dev: n for dev, n in rows if n >= policy.probation_clean_scans}


def apply_policy(
    store: Store,
    policy: QuarantinePolicy | None = None,
    *,
    devices: Sequence[str] | None = None,
    now: float | None = None,
    actions: Sequence[ActionTemplate] = (),
) -> PolicyOutcome:
    """Decide quarantines for ``devices`` (default: every device), record every decision, run ``actions``.

    The circuit breaker looks at the whole fleet even when ``devices`` is given: a suite problem is never local.
    """
    policy = policy or QuarantinePolicy()
    t = time.time() if now is None else now
    out = PolicyOutcome()
    out.reaped = store.reap(grace_s=policy.reap_grace_s, now=t)

    breaker = _breaker(store, policy, t)
    found = {} if breaker else _candidates(store, policy, t, devices)
    passed = _probation_passed(store, policy, devices)
    with store.write() as conn:
        for why in breaker:
            _decide(conn, out, Decision(device=None, decision="breaker", reason=why), t)
        out.breaker_tripped = bool(breaker)
        for dev, why in sorted(found.items()):
            if _quarantine(conn, dev, reason=why, by="policy", now=t, strict=False):
                out.quarantined.append(dev)
                _decide(conn, out, Decision(device=dev, decision="quarantine", reason=f"{dev}: {why}"), t)
        for dev, n in sorted(passed.items()):
            if dev in found:
                continue
            why = f"{n} clean complete scans since the release (policy needs {policy.probation_clean_scans})"
            _end_probation(conn, dev, reason=why, by="policy", now=t)
            out.released.append(dev)
            _decide(conn, out, Decision(device=dev, decision="probation_passed", reason=f"{dev}: {why}"), t)
    if actions:
        _run_actions(store, actions, out, t)
    return out


def _decide(conn: sqlite3.Connection, out: PolicyOutcome, d: Decision, t: float) -> None:
    conn.execute(
        "INSERT INTO policy_decisions(uuid, time, device, decision, reason) VALUES (?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, t, d.device, d.decision, d.reason),
    )
    out.decisions.append(d)
    out.reasons.append(d.reason)


def _run_actions(store: Store, actions: Sequence[ActionTemplate], out: PolicyOutcome, t: float) -> None:
    # Commands run outside any transaction (a slow kubectl must not hold the store's write lock). Two policy
    # runs at the same moment may both run a pending action: drain/taint/cordon commands are idempotent.
    by_name = {a.name: a for a in actions}
    with store.write() as conn:
        # One action row per (quarantine event, template): created once, retried until it succeeds.
        for name in by_name:
            conn.execute(
                "INSERT OR IGNORE INTO actions(uuid, device, action, quarantined_since, created) "
                "SELECT lower(hex(randomblob(16))), device, ?, since, ? FROM quarantine WHERE state = 'quarantined'",
                (name, t),
            )
    pending = store.query(
        "SELECT a.id, a.device, a.action, q.reason, COALESCE(d.host, 'unknown') AS host FROM actions a "
        "JOIN quarantine q ON q.device = a.device AND q.since = a.quarantined_since AND q.state = 'quarantined' "
        "LEFT JOIN devices d ON d.id = a.device WHERE a.done = 0 ORDER BY a.id"
    )
    for row in pending:
        template = by_name.get(row["action"])
        if template is None:
            continue  # a template no longer configured: left pending, not run
        result = run_action(template, device=row["device"], host=row["host"], reason=row["reason"])
        with store.write() as conn:
            conn.execute(
                "INSERT INTO action_attempts(uuid, action_id, time, argv, returncode, ok, output) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (_uuid.uuid4().hex, row["id"], t, json.dumps(result.argv), result.returncode, int(result.ok),
                 result.output),
            )
            conn.execute(
                "UPDATE actions SET attempts = attempts + 1, done = ? WHERE id = ?", (int(result.ok), row["id"])
            )
            kind = "action_ok" if result.ok else "action_failed"
            why = (
                f"{row['device']}: action {template.name} "
                + ("succeeded" if result.ok else f"failed ({result.returncode}: {result.output.strip()[-200:]}); retried next run")
            )
            _decide(conn, out, Decision(device=row["device"], decision=kind, reason=why), t)
        (out.actions_ok if result.ok else out.actions_failed).append((row["device"], template.name))
