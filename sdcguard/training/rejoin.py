"""A guard after a recovery decision (``escalate="recover"``): the job-wide plan, this rank's part in it, and the
guard taken up again in the re-formed group (its checks made again for the new members).

Split from :mod:`.guard` by job: everything here runs once per recovery, on the guard's own state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ..records import Incident
from .comm import Comm
from .hooks.ddp import is_ddp
from .mesh import Layout
from .recovery.engine import warm_up
from .recovery.plan import RecoveryPlan, plan_recovery
from .replay.observe import StepObserver
from .rounds.shadows import ShadowServer
from .verdicts.attribution import Attributor
from .verdicts.outcomes import Outcomes

Guard = Any
"""An :class:`~sdcguard.training.guard.SDCGuard` (not imported: the guard imports this module)."""

__all__ = ["recover", "follow", "serve_shadow"]


def recover(guard: Guard, step: int, incidents: list[Incident]) -> int | None:
    """The job-wide plan (:mod:`.recovery.plan`) from what every worker holds alike (the escalating incidents came
    out of the step's gather); the dedicated shadows are told; this worker follows it. The step to go on at."""
    suspects = {r for i in incidents for r in i.suspect_ranks}
    plan = plan_recovery(step, guard.comm.members, guard.shadow_ranks, suspects, min_replicas=guard.config.min_replicas)
    guard._round.round.reform(plan, incidents)
    return follow(guard, plan, incidents)


def serve_shadow(guard: Guard, server: ShadowServer) -> int:
    """A dedicated shadow's serving loop: a recovery's plan returns from it, and the shadow follows the plan, as a
    promoted worker (the loop ends) or as a shadow again (it serves the new group's workers)."""
    while True:
        server.serve()
        if server.reform is None or guard._recovery is None or follow(guard, *server.reform.fields()) is not None:
            return server.replays
        server.num_workers = guard.dp_size


def follow(guard: Guard, plan: RecoveryPlan, incidents: Sequence[Incident]) -> int | None:
    """This rank's part of ``plan`` (a worker's, or a dedicated shadow's told by the workers); the step the job goes
    on at (None: a shadow that stays one). A leaver, and every rank when the job cannot go on, exits here."""
    assert guard._recovery is not None
    joined = guard._recovery.execute(
        plan, guard.rank, incidents, model=guard.model, module=guard.module, batch=guard._batch,
        warm=lambda batch: warm_up(guard.loss_fn, batch, guard.params),
    )  # fmt: skip
    if joined.comm is None:
        guard.dp_size = len(plan.members)
        return None
    assert joined.snapshot is not None and joined.model is not None
    _rejoin(guard, plan, joined.comm, joined.model)
    spare = next(iter(plan.promoted), None)
    device = None if spare is None else guard.identities.get(spare, (None, ""))[0]
    guard._recovery.went_on(plan, incidents, joined.snapshot.step, device)
    guard.resume_from = joined.snapshot.step
    return guard.resume_from


def _rejoin(guard: Guard, plan: RecoveryPlan, comm: Comm, model: nn.Module) -> None:
    """Take up the re-formed group: a worker in it, numbered by its place (the order the group sums in), with the
    checks made again for its members (what was learnt about determinism and earlier suspects is kept)."""
    guard.job_comm = guard.comm = comm
    guard.group, guard.members, guard.dp_size, guard.dp_rank = comm.group, comm.members, comm.size, comm.index
    guard.data_rank, guard.role, guard.shadow_ranks = comm.index, "worker", plan.shadows
    guard.layout = Layout(ranks=tuple(comm.members), slices=(tuple(comm.members),))
    guard.model, guard._ddp = model, model if is_ddp(model) else None
    guard._attr = Attributor(guard.taps.unit_names, guard.identities, job=guard.job, job_size=comm.size)
    old, speaks = guard._outcomes, comm.index == 0
    guard._outcomes = Outcomes(guard._attr, list(comm.members), guard.device, speaks=speaks)
    guard._outcomes.determinism, guard._outcomes.unresolved = old.determinism, old.unresolved - set(plan.leavers)
    guard._responder.writer, guard._responder.before_acting = speaks, None
    guard._samples = int(comm.gather_ints([guard._samples]).max())  # a promoted spare's counter was its own
    guard._observer = StepObserver(guard.taps, rank=guard.dp_rank, device=guard.device, rng_hook=guard._rng_hook)
    guard._checks = guard._make_checks(guard._view, guard._classes, None, guard.config.checksum_rows)
