"""The quarantine (``store.quarantine``): devices taken out of service by hand or by the policy, their releases and
probations, the history of every change, what each policy run decided and why, the actions (drain, taint, a command)
each quarantine asks for and every attempt at them; and a device's status, the one definition of which is
:func:`~.rows.device_status`.

Two policy runs at once decide once: every change takes the store-wide quarantine lock first (a server's concurrent
writers; in SQLite every write is the only one).
"""

from __future__ import annotations

import getpass
import json
import os
import time
import uuid as _uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ...devices import device_kind, hostname, unknown_device
from ...durations import DEFAULT_WINDOW_S
from ...errors import BadInput
from .core import StoreCore
from .failures import Failures
from .rows import Decision, DeviceStatus, PendingAction, QuarantineEntry, device_status
from .training import Training

__all__ = ["Quarantine", "default_actor"]


def default_actor() -> str:
    """Who is acting, for the quarantine history: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{hostname()}"


class Quarantine:
    """Quarantine, probation, the policy's decisions and actions, and devices' statuses.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
        failures: the failed executions a status weighs (:class:`~.failures.Failures`).
        training: the incidents a status weighs (:class:`~.training.Training`).
    """

    def __init__(self, core: StoreCore, *, failures: Failures, training: Training) -> None:
        self._core = core
        self._failures = failures
        self._training = training

    def add(
        self, device: str, *, reason: str, by: str | None = None, now: float | None = None, new: bool = True
    ) -> None:
        """Take a device out of service (also from probation). ``BadInput`` if it already is quarantined.

        ``new``: a device the store has never seen may be quarantined (recorded with it); False refuses it with
        :class:`BadInput` naming the closest known ids (a typo must not quarantine a device that does not exist).
        """
        t = time.time() if now is None else now
        with self._core.write() as conn:
            self._core.backend.lock("quarantine")  # two policy runs at once decide once
            if not new and conn.execute("SELECT 1 FROM devices WHERE id = ?", (device,)).fetchone() is None:
                known = [r[0] for r in conn.execute("SELECT id FROM devices ORDER BY id")]
                raise unknown_device(
                    device,
                    known,
                    what=f"cannot quarantine {device}",
                    hint="; new=True quarantines a device no scan has recorded yet",
                )
            _quarantine_device(conn, device, reason=reason, by=by or default_actor(), now=t, strict=True)

    def release(self, device: str, *, reason: str, by: str | None = None, now: float | None = None) -> None:
        """Release a quarantined device by hand: it goes on probation until enough clean scans.

        ``BadInput`` (nothing written) if the device is unknown or not quarantined.
        """
        _need_reason(reason)
        t = time.time() if now is None else now
        with self._core.write() as conn:
            self._core.backend.lock("quarantine")  # two policy runs at once decide once
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
            _add_history(conn, device, "release", t, by or default_actor(), reason)

    def end_probation(self, device: str, *, reason: str, by: str = "policy", now: float | None = None) -> None:
        """A device on probation passed it: back to healthy (no quarantine row)."""
        t = time.time() if now is None else now
        with self._core.write() as conn:
            self._core.backend.lock("quarantine")  # two policy runs at once decide once
            _end_probation(conn, device, reason=reason, by=by, now=t)

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
        with self._core.write() as conn:
            self._core.backend.lock("quarantine")  # two policy runs at once decide once
            for d in notes:
                _add_decision(conn, d, now)
                out.append(d)
            for dev, why in quarantine.items():
                if _quarantine_device(conn, dev, reason=why, by="policy", now=now, strict=False):
                    d = Decision(device=dev, decision="quarantine", reason=f"{dev}: {why}")
                    _add_decision(conn, d, now)
                    out.append(d)
            for dev, why in passed_probation.items():
                if _end_probation(conn, dev, reason=why, by="policy", now=now):
                    d = Decision(device=dev, decision="probation_passed", reason=f"{dev}: {why}")
                    _add_decision(conn, d, now)
                    out.append(d)
        return out

    def pending_actions(self, names: Sequence[str], *, now: float) -> list[PendingAction]:
        """Actions (by template name) not yet run successfully for each device's current quarantine; one action
        row per (quarantine event, template) is created here the first time."""
        with self._core.write() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO actions(uuid, device, action, quarantined_since, created) "
                "SELECT lower(hex(randomblob(16))), device, ?, since, ? FROM quarantine WHERE state = 'quarantined'",
                [(name, now) for name in names],
            )
        rows = self._core.rows(
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
        with self._core.write() as conn:
            conn.execute(
                "INSERT INTO action_attempts(uuid, action_id, time, argv, returncode, ok, output) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (_uuid.uuid4().hex, action_id, now, json.dumps(list(argv)), returncode, int(ok), output),
            )
            conn.execute("UPDATE actions SET attempts = attempts + 1, done = ? WHERE id = ?", (int(ok), action_id))
            _add_decision(conn, decision, now)

    def action_attempts(self) -> list[dict[str, Any]]:
        """Every attempt of every action (device, action, when, argv, return code, ok, output), oldest first."""
        return self._core.dicts(
            "SELECT a.device, a.action, t.time, t.argv, t.returncode, t.ok, t.output FROM action_attempts t "
            "JOIN actions a ON a.id = t.action_id ORDER BY t.id"
        )

    def states(self) -> dict[str, str]:
        """``device -> "quarantined" | "probation"`` for every device with a quarantine row."""
        return {d: s for d, s in self._core.rows("SELECT device, state FROM quarantine")}

    def entries(self) -> list[QuarantineEntry]:
        """Devices quarantined or on probation, oldest first."""
        rows = self._core.rows(
            "SELECT q.device, q.state, q.since, q.reason, q.by, d.host FROM quarantine q "
            "LEFT JOIN devices d ON d.id = q.device ORDER BY q.since, q.device"
        )
        return [QuarantineEntry(device=r[0], state=r[1], since=r[2], reason=r[3], by=r[4], host=r[5]) for r in rows]

    def releases(self) -> dict[str, float]:
        """``device -> when it was last released by hand``: the boundary of its evidence (nothing from before it
        quarantines the device again, see :mod:`sdcguard.fleet.policy`)."""
        rows = self._core.rows(
            "SELECT device, MAX(time) FROM quarantine_history WHERE action = 'release' GROUP BY device"
        )
        return {d: float(t) for d, t in rows}

    def history(self, device: str | None = None) -> list[dict[str, Any]]:
        """Every quarantine change (who, when, why, action), oldest first."""
        where, params = ("WHERE device = ?", (device,)) if device else ("", ())
        return self._core.dicts(
            f"SELECT device, action, time, by, reason FROM quarantine_history {where} ORDER BY time, id", params
        )

    def decisions(self, *, since: float | None = None) -> list[Decision]:
        """What the policy decided and why, oldest first."""
        rows = self._core.rows(
            "SELECT device, decision, reason, time FROM policy_decisions WHERE time >= ? ORDER BY time, id",
            (since if since is not None else float("-inf"),),
        )
        return [Decision(device=d, decision=k, reason=r, time=t) for d, k, r, t in rows]

    def statuses(
        self, *, suspect_since: float | None, devices: Sequence[str] | None = None, failing: set[str] | None = None
    ) -> dict[str, DeviceStatus]:
        """The status of every known device (or of ``devices``), by :func:`device_status`.

        ``failing``: the devices that failed in the window, when the caller already knows them (the report
        computed them with the rates); else they are read here.
        """
        states = self.states()
        if failing is None:
            failing = self._failures.devices(since=suspect_since, devices=devices)
        named = self._training.suspects(since=suspect_since)
        ids = list(devices) if devices is not None else [r[0] for r in self._core.rows("SELECT id FROM devices")]
        suspect = (set(failing) | set(named)) & set(ids)
        for d, t in self.releases().items():  # evidence from before a release makes no device suspect
            if d in suspect and (suspect_since is None or t > suspect_since):
                if not (self._failures.devices(since=t, devices=[d]) or d in self._training.suspects(since=t)):
                    suspect.discard(d)
        return {d: device_status(states.get(d), d in suspect) for d in ids}

    def status(self, device: str, *, window_s: float = DEFAULT_WINDOW_S, now: float | None = None) -> DeviceStatus:
        """One device's status (see :func:`sdcguard.fleet.store.rows.device_status`); suspect over ``window_s``."""

        t = time.time() if now is None else now
        return self.statuses(suspect_since=t - window_s, devices=[device])[device]


def _need_reason(reason: str) -> None:
    """A change of quarantine state says why."""
    if not reason or not reason.strip():
        raise BadInput("a reason is required (--reason TEXT): the quarantine history keeps why")


def _add_history(conn: Any, device: str, action: str, t: float, by: str, reason: str) -> None:
    """One entry of the quarantine history."""
    conn.execute(
        "INSERT INTO quarantine_history(uuid, device, action, time, by, reason) VALUES (?, ?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, device, action, t, by, reason),
    )


def _add_decision(conn: Any, d: Decision, t: float) -> None:
    """One policy decision."""
    conn.execute(
        "INSERT INTO policy_decisions(uuid, time, device, decision, reason) VALUES (?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, t, d.device, d.decision, d.reason),
    )


def _quarantine_device(conn: Any, device: str, *, reason: str, by: str, now: float, strict: bool) -> bool:
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
    _add_history(conn, device, "quarantine", now, by, reason)
    return True


def _end_probation(conn: Any, device: str, *, reason: str, by: str, now: float) -> bool:
    """End ``device``'s probation; False when it was not on probation."""
    cur = conn.execute("DELETE FROM quarantine WHERE device = ? AND state = 'probation'", (device,))
    if cur.rowcount:
        _add_history(conn, device, "probation_passed", now, by, reason)
    return bool(cur.rowcount)
