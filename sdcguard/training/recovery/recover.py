"""A guard's recovery (``escalate="recover"``): when to keep a snapshot, and what every rank does once the job
decided to recover (:mod:`.plan`), through its engine (:mod:`.engine`).

Snapshots (:meth:`Recovery.begin_step`): at the start of step ``s`` the live state is copied as the candidate when
step ``s - 1`` was looked at by a check that covers every rank (a sampled step in peer mode; any sampled step with
dedicated shadows, whose verdicts come later; a checksum-checked step); the candidate becomes the verified snapshot
once the checks vouch for step ``s - 1`` on every rank: ``guard.last_verified_step`` (every rank's latest clean
sample at or after it, nothing tainted since) or a checksum-checked step where every rank checked matmuls and none
failed. Under a sticky fault that started at step ``f`` the verified snapshot is therefore the state of a step
``<= f``: the faulty device's samples from ``f`` on all fail. A one-off fault on a step no check saw is not
covered.

The recovery (:meth:`Recovery.execute`), on every rank of the job alike: the engine excludes the leavers; a leaver
exits by the contract (86) once the group is re-formed; the members heal (every member holds the voted snapshot),
roll back, get the model for the new group, roll back again (the warm-up's forward changed the buffers), and vote:
every member's live state must have the snapshot's digest (:func:`~.vote.holders`), or the job exits by the
contract (a member that does not hold it with 86: it can never commit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from torch import nn

from ...contract import EXIT_RESTART, EXIT_SUSPECT_DEVICE
from ...fingerprints import signed64
from ...records import Incident
from ..comm import Comm
from ..response import exit_by_contract
from .engine import RecoveryEngine
from .plan import RecoveryPlan
from .snapshot import Snapshot, SnapshotKeeper

__all__ = ["Recovery", "Rejoined", "Restored"]


@dataclass(frozen=True, kw_only=True)
class Rejoined:
    """What a recovery left on a rank that goes on."""

    comm: Comm | None
    """The new data-parallel group (None on a dedicated shadow that stays one)."""
    model: nn.Module | None
    """The model the loop trains in it."""
    snapshot: Snapshot | None
    """The verified state every member holds now."""


@dataclass(frozen=True, kw_only=True)
class Restored:
    """What :meth:`Recovery.restore` loaded at the start of a restarted job (the same on every worker)."""

    source: Literal["snapshot", "checkpoint", "none"]
    """A verified snapshot that survived in host memory, the disk checkpoint the fallback loaded, or nothing."""
    step: int | None
    """The step the loop goes on at (None: from the start, nothing was loaded)."""
    detail: str
    """One line: which, and why not the snapshot."""


class Recovery:
    """Snapshots and recoveries of one guard (see the module docstring).

    Args:
        keeper: the snapshots.
        engine: what re-forms the job.
        min_replicas: the fewest workers the job may go on with without a spare (None: as many as before).
    """

    def __init__(self, keeper: SnapshotKeeper, engine: RecoveryEngine, *, min_replicas: int | None) -> None:
        self.keeper = keeper
        self.engine = engine
        self.min_replicas = min_replicas
        self._looked_at: int | None = None
        """The last step a check that covers every rank looked at (its state is the next candidate)."""
        self._vouched: int = -1
        """The last step a checksum-checked step vouched for on every rank."""
        self.verdict_at: float | None = None
        """When the last recovery was decided (``time.monotonic()``), until the next step starts."""
        self._told: tuple[list[Incident], int, int, str | None] | None = None
        """The last recovery's incidents, its resume step and the spare's device, until the next step starts."""

    # ---------------------------------------------------------------------------------------------- snapshots

    def looked_at(self, step: int, *, vouched: bool) -> None:
        """Step ``step`` was checked on every rank (``vouched``: and the checks vouch for it now)."""
        self._looked_at = step
        if vouched:
            self._vouched = max(self._vouched, step)

    def begin_step(self, step: int, last_verified: int | None) -> None:
        """Promote the candidate once its predecessor step is vouched for; take a new one when the step before this
        one was looked at and no candidate waits (the verified snapshot is never overwritten)."""
        through = max(self._vouched, -1 if last_verified is None else last_verified)
        candidate = self.keeper.candidate
        if candidate is not None and candidate.step - 1 <= through:
            self.keeper.promote()
        if self._looked_at == step - 1 and self.keeper.candidate is None:
            self.keeper.take(step)
            if step - 1 <= through:
                self.keeper.promote()

    def _settle(self, last_verified: int | None, tainted_from: int | None) -> None:
        """At a recovery: the candidate becomes the verified snapshot when the checks vouch for it now, else it is
        dropped (it may hold the fault); a verified snapshot of a state the fault may have touched (a step after
        ``tainted_from``) is forgotten."""
        through = max(self._vouched, -1 if last_verified is None else last_verified)
        clean = (lambda snap: True) if tainted_from is None else (lambda snap: snap.step <= tainted_from)
        candidate = self.keeper.candidate
        if candidate is not None and candidate.step - 1 <= through and clean(candidate):
            self.keeper.promote()
        self.keeper.drop_candidate()
        if self.keeper.verified is not None and not clean(self.keeper.verified):
            self.keeper.forget()

    def fence(self) -> None:
        """Before the optimizer changes the tensors a copy in flight reads (no host synchronisation)."""
        self.keeper.fence()

    # ----------------------------------------------------------------------------------------------- recovery

    def execute(
        self, plan: RecoveryPlan, rank: int, incidents: Sequence[Incident], *, model: nn.Module, module: nn.Module,
        batch: Any, warm: Callable[[Any], Callable[[nn.Module], None]], last_verified: int | None = None,
        tainted_from: int | None = None,
    ) -> Rejoined:  # fmt: skip
        """This rank's part of the recovery (see the module docstring); exits by the contract where the plan or
        the vote says so. ``last_verified``: the guard's last verified step with this step's verdicts in (a
        candidate they now vouch for is the newest verified state: with dedicated shadows the verdict that vouches
        for it may arrive in the same step as the one that names the fault); ``tainted_from``: the earliest step the
        fault could have touched (a snapshot of a later state is never rolled back to: a checksum-checked step
        vouches for the matmuls only)."""
        self.verdict_at = time.monotonic()
        self._settle(last_verified, tainted_from)
        self._looked_at = None
        if plan.action == "exit":
            exit_by_contract(plan.status(rank), incidents, _why(plan, "no spare, and too few replicas to go on"))
        comm = self.engine.exclude(plan)
        if rank in plan.leavers:
            exit_by_contract(
                EXIT_SUSPECT_DEVICE, incidents, _why(plan, "this rank left the job; the others went on"), left=True
            )
        if comm is None:
            return Rejoined(comm=None, model=None, snapshot=None)
        healed = self.engine.heal(comm, self.keeper.verified, batch)
        if healed.state is None:
            exit_by_contract(EXIT_RESTART, incidents, _why(plan, "no verified snapshot that the replicas agree on"))
        snap = healed.snapshot
        if snap is not None:
            self.engine.roll_back(self.keeper, snap)
        model = self.engine.promote(comm, model, module, warm(healed.batch))
        if snap is not None:
            self.engine.roll_back(self.keeper, snap)
            self.keeper.adopt(snap)
        mine = self.keeper.live_digest() if snap is not None else 0
        digests = [row[0] for row in comm.gather_ints([signed64(mine)]).tolist()]
        expected = signed64(healed.state[1])
        if any(d != expected for d in digests):  # the post-heal vote: nobody commits a state it does not hold
            status = EXIT_SUSPECT_DEVICE if signed64(mine) != expected else EXIT_RESTART
            exit_by_contract(status, incidents, _why(plan, "a replica does not hold the verified state after the heal"))
        return Rejoined(comm=comm, model=model, snapshot=snap)

    def restore(self, comm: Comm, found: Snapshot | None, fallback: Callable[[], int] | None, why: str) -> Restored:
        """At the start of a restarted job, on every worker alike: the newest snapshot a strict majority of the
        holders confirm (``found``: this rank's, from :func:`~.shared.survivors`; ``why``: why others were refused) is
        healed to every member, rolled back to and voted on like a recovery's; without one, ``fallback()`` loads
        the last verified disk checkpoint and returns the step to go on at."""
        self.verdict_at = time.monotonic()
        healed = self.engine.heal(comm, found, None)
        if healed.state is None:
            refused = f" ({why})" if why else ""
            if fallback is None:
                return Restored(source="none", step=None, detail=f"no verified snapshot survived{refused}")
            step = fallback()
            return Restored(
                source="checkpoint", step=step,
                detail=f"no snapshot the replicas confirm{refused}: the last verified disk checkpoint, step {step}",
            )  # fmt: skip
        snap = healed.snapshot
        if snap is not None:
            self.engine.roll_back(self.keeper, snap)
            self.keeper.adopt(snap)
        mine = self.keeper.live_digest() if snap is not None else 0
        digests = [row[0] for row in comm.gather_ints([signed64(mine)]).tolist()]
        if any(d != signed64(healed.state[1]) for d in digests):
            status = EXIT_SUSPECT_DEVICE if signed64(mine) != signed64(healed.state[1]) else EXIT_RESTART
            exit_by_contract(status, [], "restart: a replica does not hold the snapshot the others confirm")
        step = healed.state[0]
        return Restored(source="snapshot", step=step, detail=f"the verified snapshot in host memory, step {step}")

    def went_on(self, plan: RecoveryPlan, incidents: Sequence[Incident], resume: int, replacement: str | None) -> None:
        """The recovery of ``plan`` left this rank going on at step ``resume`` (``replacement``: the spare's
        device)."""
        self._told = (list(incidents), plan.step, resume, replacement)

    def finished(self, step: int) -> list[Incident]:
        """At the first step after a recovery: its incidents with how it went (the recovered step, the steps lost,
        the seconds from the verdict to this step, the spare's device); [] at any other step."""
        told, self._told = self._told, None
        at, self.verdict_at = self.verdict_at, None
        if told is None or at is None:
            return []
        incidents, at_step, resume, replacement = told
        seconds = time.monotonic() - at
        return [
            replace(
                i,
                recovered_step=resume,
                steps_lost=at_step - resume + 1,
                recovery_s=seconds,
                replacement_device=replacement,
            )  # fmt: skip
            for i in incidents
        ]


def _why(plan: RecoveryPlan, what: str) -> str:
    return f"recovery at step {plan.step} (leaving: {list(plan.leavers)}): {what}"
