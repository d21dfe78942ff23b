"""A guard's part in a recovery (``escalate="recover"``): the job-wide plan, this rank's part in it, and the guard
taken up again in the re-formed group.

Split from :mod:`.guard` by job: the snapshots' part of each step, and everything that runs once per recovery. It
is an object of its own (:class:`Rejoin`) that reaches the guard only through a small public seam (:class:`Member`):
what the plan reads (the rank, the workers, the shadows, the model and the last batch), :meth:`Member.tell_shadows`
(the shadows learn the plan) and :meth:`Member.regroup` (the guard takes up the new group and makes its checks
again). A guard without ``escalate="recover"`` holds a :class:`NoRejoin`: the same interface, doing nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torch import nn

from ..errors import BadInput
from ..logs import get_logger
from ..records import Incident
from .comm import Comm
from .config import GuardConfig
from .hooks.fsdp import is_fsdp
from .recovery.engine import warm_up
from .recovery.plan import RecoveryPlan, plan_recovery
from .recovery.recover import Recovery, Restored
from .recovery.setup import make_recovery
from .recovery.state import Stateful
from .replay.recompute import LossFn
from .rounds.shadows import ShadowServer
from .verdicts.verification import Verification

__all__ = ["Member", "NoRejoin", "Rejoin", "make_rejoin"]

_log = get_logger("training")


class Member(Protocol):
    """What a recovery reads from and asks of the guard it belongs to (an :class:`~.guard.SDCGuard`)."""

    @property
    def rank(self) -> int: ...

    @property
    def members(self) -> Sequence[int]:
        """The data-parallel workers, in data-rank order."""

    @property
    def shadow_ranks(self) -> tuple[int, ...]: ...

    @property
    def identities(self) -> dict[int, tuple[str | None, str]]:
        """Global rank -> (device id, host)."""

    @property
    def model(self) -> nn.Module:
        """The model as the loop trains it (DDP-wrapped)."""

    @property
    def module(self) -> nn.Module:
        """The module without data-parallel wrapper."""

    @property
    def loss_fn(self) -> LossFn:
        """The guard's loss function (a new DDP's warm-up runs it once)."""

    @property
    def last_batch(self) -> Any:
        """This rank's last micro-batch (a warm-up batch for a new DDP), or None."""

    def tell_shadows(self, plan: RecoveryPlan, incidents: Sequence[Incident]) -> None:
        """Send the plan to the dedicated shadows (they take part in every collective of the recovery)."""

    def regroup(self, comm: Comm, model: nn.Module, *, shadows: Sequence[int], leavers: Sequence[int]) -> None:
        """Take up the re-formed group ``comm`` as a worker (numbered by its place), training ``model``."""


class Rejoin:
    """One guard's recoveries (see the module docstring).

    Args:
        member: the guard.
        recovery: its snapshots and engine.
        loss_fn: the guard's loss function (a new DDP's warm-up runs it once).
        params: the parameters whose gradients a warm-up drops.
        identities: global rank -> (device id, host): a promoted spare's device goes into the incidents.
        min_replicas: the fewest workers the job may go on with without a spare.
    """

    def __init__(
        self,
        member: Member,
        recovery: Recovery,
        *,
        loss_fn: LossFn,
        params: list[nn.Parameter],
        identities: dict[int, tuple[str | None, str]],
        min_replicas: int | None,
    ) -> None:
        self.member, self.recovery = member, recovery
        self.loss_fn, self.params, self.identities, self.min_replicas = loss_fn, params, identities, min_replicas
        self.resume_from: int | None = None
        """The step the last recovery went on from."""

    def begin_step(self, step: int, last_verified: int | None) -> list[Incident]:
        """Before step ``step``: the snapshots' part (:meth:`~.recovery.recover.Recovery.begin_step`), and the
        incidents of a recovery this step finished, with how it went (to record)."""
        self.recovery.begin_step(step, last_verified)
        return self.recovery.finished(step)

    def end_step(self, step: int, *, committed_sample: bool) -> None:
        """After the step's checks, before the optimizer: a snapshot copy in flight is read first; a sampled step
        every rank committed is noted."""
        self.recovery.fence()
        if committed_sample:
            self.recovery.sampled(step)

    @property
    def snapshot_step(self) -> int | None:
        """The step the verified snapshot starts (what a recovery would roll back to now); None: none kept."""
        verified = self.recovery.keeper.verified
        return None if verified is None else verified.step

    def recover(self, step: int, incidents: list[Incident], verification: Verification) -> int | None:
        """The job-wide plan (:mod:`.recovery.plan`) from what every worker holds alike (the escalating incidents
        came out of the step's gather); the dedicated shadows are told; this worker follows it (``verification``:
        the guard's, this step's verdicts in: its last verified step, and the earliest step the fault could have
        touched). The step to go on at; None when ``incidents`` is empty."""
        if not incidents:
            return None
        last_verified, tainted_from = verification.last_verified_step, verification.tainted_from
        m = self.member
        named = {r for i in incidents if i.kind != "unresolved" for r in i.suspect_ranks}
        undecided = {r for i in incidents if i.kind == "unresolved" for r in i.suspect_ranks}
        plan = plan_recovery(
            step,
            m.members,
            m.shadow_ranks,
            named,
            min_replicas=self.min_replicas,
            undecided=undecided,
            replicas=self.recovery.engine.replicas(m.members),
        )
        m.tell_shadows(plan, incidents)
        return self.follow(plan, incidents, last_verified, tainted_from)

    def restore(self, comm: Comm, fallback: Callable[[], int] | None) -> Restored:
        """At the start of a restarted job (:meth:`~.guard.SDCGuard.restore`): what survived in this node's shared
        memory (:mod:`.recovery.shared`), voted on; the first worker says which state the job goes on from."""
        keeper = self.recovery.keeper
        found, refused = keeper.shared.survivor(keeper.live.fits) if keeper.shared is not None else (None, [])
        restored = self.recovery.restore(comm, found, fallback, "; ".join(refused))
        if comm.index == 0:
            _log.warning("restart: %s", restored.detail)
        self.resume_from = restored.step
        return restored

    def close(self) -> None:
        """The job ended well: the snapshots kept in shared memory for a restart are let go (the node's memory)."""
        if self.recovery.keeper.shared is not None:
            self.recovery.keeper.shared.clear()

    def serve(self, server: ShadowServer) -> int:
        """A dedicated shadow's serving loop: a recovery's plan returns from it, and the shadow follows the plan, as
        a promoted worker (the loop ends) or as a shadow again (it serves the new group's workers)."""
        while True:
            server.serve()
            if server.reform is None:
                return server.replays
            plan, incidents = server.reform.fields()
            if self.follow(plan, incidents, None, None) is not None:
                return server.replays
            server.num_workers = len(plan.members)

    def follow(
        self, plan: RecoveryPlan, incidents: Sequence[Incident], last_verified: int | None, tainted_from: int | None
    ) -> int | None:
        """This rank's part of ``plan`` (a worker's, or a dedicated shadow's told by the workers); the step the job
        goes on at (None: a shadow that stays one). A leaver, and every rank when the job cannot go on, exits here."""
        m = self.member
        joined = self.recovery.execute(
            plan,
            m.rank,
            incidents,
            model=m.model,
            module=m.module,
            batch=m.last_batch,
            last_verified=last_verified,
            tainted_from=tainted_from,
            warm=lambda batch: warm_up(self.loss_fn, batch, self.params),
        )
        if joined.comm is None:
            return None
        assert joined.snapshot is not None and joined.model is not None
        m.regroup(joined.comm, joined.model, shadows=plan.shadows, leavers=plan.leavers)
        spare = next(iter(plan.promoted), None)
        device = None if spare is None else self.identities.get(spare, (None, ""))[0]
        self.recovery.went_on(plan, incidents, joined.snapshot.step, device)
        self.resume_from = joined.snapshot.step
        return self.resume_from


class NoRejoin:
    """The part of a guard without ``escalate="recover"``: :class:`Rejoin`'s interface, keeping no snapshot and never
    recovering, so the guard asks the same of both."""

    resume_from: int | None = None
    snapshot_step: int | None = None

    def begin_step(self, step: int, last_verified: int | None) -> list[Incident]:
        return []

    def end_step(self, step: int, *, committed_sample: bool) -> None:
        pass

    def recover(self, step: int, incidents: list[Incident], verification: Verification) -> int | None:
        return None

    def restore(self, comm: Comm, fallback: Callable[[], int] | None) -> Restored:
        raise BadInput('guard.restore() runs on the workers of a guard with escalate="recover"')

    def serve(self, server: ShadowServer) -> int:
        return server.serve()

    def close(self) -> None:
        pass


def make_rejoin(
    member: Member,
    config: GuardConfig,
    optimizer: Stateful | None,
    state: Sequence[Stateful],
    *,
    snapshot_dir: str | os.PathLike[str] | None,
    meshed: bool,
) -> Rejoin | NoRejoin:
    """The recoveries of a guard (``member``) built from its settings (:func:`~.recovery.setup.make_recovery`
    refuses what it cannot re-form; ``meshed``: the job's mesh has model-parallel or pipeline dimensions);
    :class:`NoRejoin` unless ``escalate="recover"``."""
    min_replicas = config.min_replicas
    recovery = make_recovery(
        config.escalate,
        member.module,
        optimizer,
        state,
        fsdp=is_fsdp(member.module),
        meshed=meshed,
        workers=member.members,
        replicas=min_replicas,
        snapshot_dir=snapshot_dir,
        rank=member.rank,
    )
    if recovery is None:
        return NoRejoin()
    return Rejoin(
        member,
        recovery,
        loss_fn=member.loss_fn,
        params=list(member.module.parameters()),
        identities=member.identities,
        min_replicas=min_replicas,
    )
