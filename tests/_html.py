"""A small fleet store for the HTML report's tests: two hosts (one a lemon), a quarantine, an incident, a checkpoint."""

from __future__ import annotations

from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, clean, result, scan

HOSTILE = "<script>alert('x')</script>&\"'"
"""A string no page may show as markup."""


def fill_store(store: Store, *, hostile: str = "x") -> None:
    """Two hosts; ``lemon`` has a quarantined, a suspect and a healthy device, ``good`` two healthy ones; an
    incident that names a device, a checkpoint to roll back to."""
    t = NOW - 3 * 3600
    scan(store, "sim:1", [*clean("sim:1", 30, t=t), result("sim:1", passed=False, t=t + 40)], host="lemon", t=t)
    scan(
        store,
        "sim:2",
        [*clean("sim:2", 30, t=t), *[result("sim:2", passed=False, t=t + 50 + i) for i in range(3)]],
        host="lemon",
        t=t,
    )
    scan(store, "sim:3", clean("sim:3", 30, t=t), host="lemon", t=t)
    scan(store, "sim:4", clean("sim:4", 30, t=t), host=f"good{hostile}", t=t)
    scan(store, "sim:5", clean("sim:5", 30, t=t), host=f"good{hostile}", t=t)
    store.quarantine.add("sim:2", reason=f"sticky failure {hostile}", by=f"alice{hostile}", now=NOW - 2 * 3600)
    store.training.record_checkpoint(
        checkpoint_id=f"ckpt-100{hostile}", step=100, verified=True, job="4242", now=NOW - 7200
    )
    store.training.record_incident(
        Incident(
            kind="replay",
            step=130,
            suspect_ranks=(1,),
            device="sim:2",
            devices=("sim:2",),
            hosts=("lemon",),
            detail=f"local grads differ {hostile}",
            job="4242",
            time=NOW - 3000,
            rollback=f"ckpt-100{hostile}",
        )
    )
