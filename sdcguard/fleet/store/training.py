"""The training side's record (``store.training``): the incidents a guard reports, the checkpoints it saves, and
the scrubs that re-read checkpoints at rest; and which devices the incidents name as suspects."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid as _uuid
from collections.abc import Sequence

from ...devices import hostname
from ...errors import BadInput
from ...records import Incident
from .core import StoreCore, where_clause
from .rows import CheckpointEntry, ScrubEntry
from .writes.results import ensure_device, jdump

__all__ = ["Training", "incident_from_json"]

_INCIDENT_FIELDS = frozenset(Incident.__dataclass_fields__)
_TUPLE_FIELDS = ("suspect_ranks", "devices", "hosts")


def incident_from_json(text: str) -> Incident:
    """An :class:`Incident` from its stored record; fields this version does not know are left out."""
    data = {k: v for k, v in json.loads(text).items() if k in _INCIDENT_FIELDS}
    for key in _TUPLE_FIELDS:
        if key in data:
            data[key] = tuple(data[key])
    return Incident(**data)


class Training:
    """Incidents, checkpoints and scrubs: their writes (each one transaction, with a natural key a spool's copy
    keeps) and their reads.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def record_incident(self, incident: Incident, *, uuid: str | None = None) -> int:
        """Record a training incident; returns its id. The whole record is kept as JSON next to the indexed
        columns, so an optional field added to :class:`Incident` later needs no change here. ``uuid``: its
        natural key (default: a new one); an incident whose uuid the store holds is not recorded again."""
        named = {d for d in (incident.device, *incident.devices) if d}
        record = jdump(dataclasses.asdict(incident))
        with self._core.write() as conn:
            host = incident.hosts[0] if incident.hosts else "unknown"
            self._core.lock_devices(named)
            for i, d in enumerate(incident.devices or ((incident.device,) if incident.device else ())):
                ensure_device(conn, d, incident.hosts[i] if i < len(incident.hosts) else host, incident.time)
            cur = conn.execute(
                "INSERT INTO incidents(uuid, kind, step, suspect_ranks, device, devices, hosts, detail, parameter, "
                "sticky, job, time, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(uuid) DO UPDATE SET uuid = excluded.uuid RETURNING id",
                (
                    uuid or _uuid.uuid4().hex,
                    incident.kind,
                    incident.step,
                    jdump(list(incident.suspect_ranks)),
                    incident.device,
                    jdump(list(incident.devices)),
                    jdump(list(incident.hosts)),
                    incident.detail,
                    incident.parameter,
                    None if incident.sticky is None else int(incident.sticky),
                    incident.job,
                    incident.time,
                    record,
                ),
            )
            iid = int(cur.fetchone()[0])  # (the row already there when its uuid was: a spool's copy)
            conn.executemany(
                "INSERT OR IGNORE INTO incident_devices(incident, device) VALUES (?, ?)",
                [(iid, d) for d in sorted(named)],
            )
            return iid

    def record_checkpoint(
        self,
        *,
        checkpoint_id: str,
        step: int,
        verified: bool,
        digest: str = "",
        job: str | None = None,
        now: float | None = None,
        status: str = "saved",
        detail: str = "",
        uuid: str | None = None,
    ) -> int:
        """Record a checkpoint the training guard saved (``status="failed"``: its write failed, with ``detail``;
        never verified); returns its row id. ``uuid``: its natural key (default: a new one), recorded once."""
        if not checkpoint_id:
            raise BadInput("a checkpoint needs an id")
        if status not in ("saved", "failed"):
            raise BadInput(f"checkpoint status must be 'saved' or 'failed', not {status!r}")
        with self._core.write() as conn:
            cur = conn.execute(
                "INSERT INTO checkpoints(uuid, checkpoint_id, step, verified, digest, job, time, status, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(uuid) DO UPDATE SET uuid = excluded.uuid RETURNING id",
                (
                    uuid or _uuid.uuid4().hex,
                    str(checkpoint_id),
                    int(step),
                    int(bool(verified) and status == "saved"),
                    digest or "",
                    job,
                    time.time() if now is None else now,
                    status,
                    detail,
                ),
            )
            return int(cur.fetchone()[0])

    def record_scrub(
        self,
        *,
        checkpoint_id: str,
        status: str,
        tensors: int,
        bytes: int,
        bad: Sequence[str] = (),
        unverified: Sequence[str] = (),
        detail: str = "",
        now: float | None = None,
        uuid: str | None = None,
    ) -> int:
        """Record one checkpoint re-read at rest (``sdcguard scrub``); returns its row id. ``unverified``: the items
        it could not compare (no recorded fingerprint, saved with transforms). ``uuid``: its natural key (default: a
        new one), recorded once."""
        if status not in ("clean", "corrupt", "unreadable", "unverified"):
            raise BadInput(f"scrub status must be clean, corrupt, unverified or unreadable, not {status!r}")
        with self._core.write() as conn:
            cur = conn.execute(
                "INSERT INTO checkpoint_scrubs(uuid, checkpoint_id, status, tensors, bytes, bad, unverified, detail, "
                "host, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(uuid) DO UPDATE SET uuid = excluded.uuid RETURNING id",
                (
                    uuid or _uuid.uuid4().hex,
                    str(checkpoint_id),
                    status,
                    int(tensors),
                    int(bytes),
                    json.dumps(list(bad)),
                    json.dumps(list(unverified)),
                    detail,
                    hostname(),
                    time.time() if now is None else now,
                ),
            )
            return int(cur.fetchone()[0])

    def incidents(self, *, since: float | None = None, device: str | None = None) -> list[Incident]:
        """Recorded incidents, oldest first; with ``device``, those naming it."""
        where, params = where_clause(
            ("i.time >= ?", since), ("i.id IN (SELECT incident FROM incident_devices WHERE device = ?)", device)
        )
        rows = self._core.rows(f"SELECT i.record FROM incidents i {where} ORDER BY i.time, i.id", params)
        return [incident_from_json(r[0]) for r in rows]

    def suspects(self, *, since: float | None) -> set[str]:
        """Devices a training incident named as a suspect since ``since`` (alone, or among the suspects of an
        unresolved one); ``nondeterministic`` and ``slow`` incidents name nobody."""
        where, params = ("AND i.time >= ?", [since]) if since is not None else ("", [])
        return {
            r[0]
            for r in self._core.rows(
                "SELECT DISTINCT d.device FROM incident_devices d JOIN incidents i ON i.id = d.incident "
                f"WHERE i.kind NOT IN ('nondeterministic', 'slow') {where}",
                params,
            )
        }

    def checkpoints(self, *, since: float | None = None, job: str | None = None) -> list[CheckpointEntry]:
        """Recorded checkpoints, oldest first; with ``job``, that job's."""
        where, params = where_clause(("time >= ?", since), ("job = ?", job))
        return [
            CheckpointEntry(
                checkpoint_id=r["checkpoint_id"],
                step=int(r["step"]),
                verified=bool(r["verified"]),
                digest=r["digest"],
                job=r["job"],
                time=float(r["time"]),
                status=r["status"],
                detail=r["detail"],
            )
            for r in self._core.dicts(f"SELECT * FROM checkpoints {where} ORDER BY time, id", params)
        ]

    def scrubs(self, *, since: float | None = None, checkpoint_id: str | None = None) -> list[ScrubEntry]:
        """Checkpoints re-read at rest (``sdcguard scrub``), oldest first; with ``checkpoint_id``, that one's."""
        where, params = where_clause(("time >= ?", since), ("checkpoint_id = ?", checkpoint_id))
        return [
            ScrubEntry(
                checkpoint_id=r["checkpoint_id"],
                status=r["status"],
                tensors=int(r["tensors"]),
                bytes=int(r["bytes"]),
                bad=tuple(json.loads(r["bad"])),
                unverified=tuple(json.loads(r["unverified"])),
                detail=r["detail"],
                host=r["host"],
                time=float(r["time"]),
            )
            for r in self._core.dicts(f"SELECT * FROM checkpoint_scrubs {where} ORDER BY time, id", params)
        ]
