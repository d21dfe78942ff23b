"""The store's reads not yet moved to a job of their own (part of :class:`~.store.Store`): the quarantine's and the
policy's, and the size of a table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ...durations import DEFAULT_WINDOW_S
from ...records import Incident
from .connection import StoreBase
from .rows import Decision, DeviceStatus, QuarantineEntry, device_status

__all__ = ["StoreQueries"]
_INCIDENT_FIELDS = frozenset(Incident.__dataclass_fields__)
_TUPLE_FIELDS = ("suspect_ranks", "devices", "hosts")


class StoreQueries(StoreBase):
    """Named read queries of the fleet store (part of :class:`sdcguard.fleet.store.store.Store`)."""

    def row_count(self, table: Literal["results", "scans", "devices", "incidents", "rollups"]) -> int:
        """``SELECT COUNT(*)`` of one table: the floor every aggregation is measured against."""
        if table not in ("results", "scans", "devices", "incidents", "rollups"):
            raise ValueError(f"no table {table!r}")
        return int(self._one(f"SELECT COUNT(*) FROM {table}"))

    # ------------------------------------------------------------------ what the policy weighs
    # ------------------------------------------------------------------ status and scans
    def quarantine_states(self) -> dict[str, str]:
        """``device -> "quarantined" | "probation"`` for every device with a quarantine row."""
        return {d: s for d, s in self._rows("SELECT device, state FROM quarantine")}

    def statuses(
        self, *, suspect_since: float | None, devices: Sequence[str] | None = None, failing: set[str] | None = None
    ) -> dict[str, DeviceStatus]:
        """The status of every known device (or of ``devices``), by :func:`device_status`.

        ``failing``: the devices that failed in the window, when the caller already knows them (the report
        computed them with the rates); else they are read here.
        """
        states = self.quarantine_states()
        if failing is None:
            failing = self.failures.devices(since=suspect_since, devices=devices)
        named = self.training.suspects(since=suspect_since)
        ids = list(devices) if devices is not None else [r[0] for r in self._rows("SELECT id FROM devices")]
        return {d: device_status(states.get(d), d in failing or d in named) for d in ids}

    def quarantine_status(
        self, device: str, *, window_s: float = DEFAULT_WINDOW_S, now: float | None = None
    ) -> DeviceStatus:
        """One device's status (see :func:`sdcguard.fleet.store.rows.device_status`); suspect over ``window_s``."""
        import time

        t = time.time() if now is None else now
        return self.statuses(suspect_since=t - window_s, devices=[device])[device]

    # ------------------------------------------------------------------ quarantine
    def quarantine_list(self) -> list[QuarantineEntry]:
        """Devices quarantined or on probation, oldest first."""
        rows = self._rows(
            "SELECT q.device, q.state, q.since, q.reason, q.by, d.host FROM quarantine q "
            "LEFT JOIN devices d ON d.id = q.device ORDER BY q.since, q.device"
        )
        return [QuarantineEntry(device=r[0], state=r[1], since=r[2], reason=r[3], by=r[4], host=r[5]) for r in rows]

    def quarantine_history(self, device: str | None = None) -> list[dict[str, Any]]:
        """Every quarantine change (who, when, why, action), oldest first."""
        where, params = ("WHERE device = ?", (device,)) if device else ("", ())
        return self._dicts(
            f"SELECT device, action, time, by, reason FROM quarantine_history {where} ORDER BY time, id", params
        )

    def decisions(self, *, since: float | None = None) -> list[Decision]:
        """What the policy decided and why, oldest first."""
        rows = self._rows(
            "SELECT device, decision, reason, time FROM policy_decisions WHERE time >= ? ORDER BY time, id",
            (since if since is not None else float("-inf"),),
        )
        return [Decision(device=d, decision=k, reason=r, time=t) for d, k, r, t in rows]

    # ------------------------------------------------------------------ plots
