"""The quarantine's rows, written inside the store's transactions: a state change and its history entry, a policy
decision, the end of a probation."""

from __future__ import annotations

import uuid as _uuid
from typing import Any

from ...devices import device_kind
from ...errors import BadInput
from .rows import Decision

__all__ = ["need_reason", "add_history", "add_decision", "quarantine_device", "end_probation"]


def need_reason(reason: str) -> None:
    """A change of quarantine state says why."""
    if not reason or not reason.strip():
        raise BadInput("a reason is required (--reason TEXT): the quarantine history keeps why")


def add_history(conn: Any, device: str, action: str, t: float, by: str, reason: str) -> None:
    """One entry of the quarantine history."""
    conn.execute(
        "INSERT INTO quarantine_history(uuid, device, action, time, by, reason) VALUES (?, ?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, device, action, t, by, reason),
    )


def add_decision(conn: Any, d: Decision, t: float) -> None:
    """One policy decision."""
    conn.execute(
        "INSERT INTO policy_decisions(uuid, time, device, decision, reason) VALUES (?, ?, ?, ?, ?)",
        (_uuid.uuid4().hex, t, d.device, d.decision, d.reason),
    )


def quarantine_device(conn: Any, device: str, *, reason: str, by: str, now: float, strict: bool) -> bool:
    """Quarantine ``device``; False (nothing written) if it already is. ``strict``: raise instead."""
    need_reason(reason)
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
    add_history(conn, device, "quarantine", now, by, reason)
    return True


def end_probation(conn: Any, device: str, *, reason: str, by: str, now: float) -> bool:
    """End ``device``'s probation; False when it was not on probation."""
    cur = conn.execute("DELETE FROM quarantine WHERE device = ? AND state = 'probation'", (device,))
    if cur.rowcount:
        add_history(conn, device, "probation_passed", now, by, reason)
    return bool(cur.rowcount)
