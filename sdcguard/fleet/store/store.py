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
from ...errors import BadInput
from .maintenance import StoreMaintenance
from .quarantine import add_decision, add_history, end_probation, need_reason, quarantine_device
from .queries import StoreQueries
from .rows import Decision, PendingAction, QuarantineEntry

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
