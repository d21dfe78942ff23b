"""A guard's recovery (``escalate="recover"``): when to keep a snapshot, and what every rank does once the job
decided to recover (:mod:`.plan`), through its engine (:mod:`.engine`).

Snapshots (:meth:`Recovery.begin_step`): at the start of step ``s`` the live state is copied as the pending snapshot
when step ``s - 1`` was sampled on every rank and committed; it becomes the verified snapshot once the samples vouch
for step ``s - 1``: ``guard.last_verified_step >= s - 1`` (every rank's latest clean sample at or after it, nothing
tainted since). Under a sticky fault that started at step ``f`` the verified snapshot is therefore the state of a
step ``<= f``: the faulty device's samples from ``f`` on all fail. A one-off fault on a step no check saw is not
covered. Only samples vouch for a snapshot: a checksum-checked step vouches for its matmuls, not for an elementwise
fault, and a snapshot after every checked step (one in 4 at the defaults) would cost more than the goal of 1% of a
step (docs/recovery.md).

The recovery (:meth:`Recovery.execute`), on every rank of the job alike: the engine excludes the leavers; a leaver
exits by the contract (86) once the group is re-formed, and so do the healthy ranks of its replica when a replica
spans several ranks (85: an HSDP replica missing a shard cannot go on); the members heal (every member holds the
voted snapshot), roll back, get the model for the new group, roll back again (the warm-up's forward changed the
buffers), and vote: every member's live state must have the digest its shard's holders voted for, or the job exits
by the contract (a member that does not hold it with 86: it can never commit).
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
        self._sampled: int | None = None
        """The last step sampled on every rank and committed (the state after it is the next snapshot)."""
        self.verdict_at: float | None = None
        """When the last recovery was decided (``time.monotonic()``), until the next step starts."""
        self._told: tuple[list[Incident], int, int, str | None] | None = None
        """The last recovery's incidents, its resume step and the spare's device, until the next step starts."""

    # ---------------------------------------------------------------------------------------------- snapshots

    def sampled(self, step: int) -> None:
        """Step ``step`` was sampled on every rank and committed (its verdicts may come later)."""
        self._sampled = step

    def begin_step(self, step: int, last_verified: int | None) -> None:
        """Anchor the pending snapshot once the samples vouch for it; when the step before this one was sampled and
        no snapshot is pending, take the state this step starts from as the pending one
        (:class:`~.snapshot.SnapshotKeeper`)."""
        self._anchor(last_verified)
        if self._sampled == step - 1 and "pending" not in self.keeper.lanes:
            self.keeper.take(step, "pending")
            self._anchor(last_verified)

    def _anchor(self, last_verified: int | None, clean: Callable[[Snapshot], bool] = lambda snap: True) -> None:
        """The pending snapshot becomes the anchored one when the samples vouch for it (and it is ``clean``)."""
        snap = self.keeper.lanes.get("pending")
        if snap is not None and last_verified is not None and snap.step - 1 <= last_verified and clean(snap):
            self.keeper.put("anchored", snap)
            self.keeper.put("pending", None)

    def _settle(self, last_verified: int | None, tainted_from: int | None) -> None:
        """At a recovery: what the samples vouch for now is anchored; the pending snapshot is dropped (nothing
        vouches for it), and so is an anchored one from after the earliest step the fault could have touched
        (``tainted_from``: it cannot be, by the rule of :mod:`~..verdicts.verification`; checked all the same)."""
        clean = (lambda snap: True) if tainted_from is None else (lambda snap: snap.step <= tainted_from)
        self._anchor(last_verified, clean)
        self.keeper.put("pending", None)
        anchored = self.keeper.lanes.get("anchored")
        if anchored is not None and not clean(anchored):
            self.keeper.put("anchored", None)

    def fence(self) -> None:
        """Before the optimizer changes the tensors a copy in flight reads (no host synchronisation)."""
        self.keeper.fence()

    # ----------------------------------------------------------------------------------------------- recovery

    def execute(
        self,
        plan: RecoveryPlan,
        rank: int,
        incidents: Sequence[Incident],
        *,
        model: nn.Module,
        module: nn.Module,
        batch: Any,
        warm: Callable[[Any], Callable[[nn.Module], None]],
        last_verified: int | None = None,
        tainted_from: int | None = None,
    ) -> Rejoined:
        """This rank's part of the recovery (see the module docstring); exits by the contract where the plan or
        the vote says so. ``last_verified``: the guard's last verified step with this step's verdicts in (a pending
        snapshot they now vouch for is the newest verified state: with dedicated shadows the verdict that vouches
        for it may arrive in the same step as the one that names the fault); ``tainted_from``: the earliest step the
        fault could have touched (a snapshot of a later state is never rolled back to)."""
        self.verdict_at = time.monotonic()
        self._settle(last_verified, tainted_from)
        self._sampled = None
        if plan.action == "exit":
            exit_by_contract(plan.status(rank), incidents, _why(plan, "no spare, and too few replicas to go on"))
        comm = self.engine.exclude(plan)
        if rank in plan.leavers:
            exit_by_contract(
                EXIT_SUSPECT_DEVICE, incidents, _why(plan, "this rank left the job; the others went on"), left=True
            )
        if rank in plan.released:
            why = "this rank's replica left with a suspect rank (a replica missing a shard cannot go on)"
            exit_by_contract(EXIT_RESTART, incidents, _why(plan, why), left=True)
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
        status = self._post_heal_vote(comm, snap, healed.state[1])
        if status is not None:
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
                source="checkpoint",
                step=step,
                detail=f"no snapshot the replicas confirm{refused}: the last verified disk checkpoint, step {step}",
            )
        snap = healed.snapshot
        if snap is not None:
            self.engine.roll_back(self.keeper, snap)
            self.keeper.adopt(snap)
        status = self._post_heal_vote(comm, snap, healed.state[1])
        if status is not None:
            exit_by_contract(status, [], "restart: a replica does not hold the snapshot the others confirm")
        step = healed.state[0]
        return Restored(source="snapshot", step=step, detail=f"the verified snapshot in host memory, step {step}")

    def _post_heal_vote(self, comm: Comm, snap: Snapshot | None, voted: int) -> int | None:
        """Nobody commits a state it does not hold: every member's live state must have the digest the holders of its
        shard voted for (``voted``: this member's; one state for all under DDP). None when every member's has, else
        this rank's exit status (86 where its own has not)."""
        mine = signed64(self.keeper.live_digest() if snap is not None else 0)
        rows = comm.gather_ints([mine, signed64(voted)]).tolist()
        if all(held == expected for held, expected in rows):
            return None
        return EXIT_SUSPECT_DEVICE if mine != signed64(voted) else EXIT_RESTART

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
            )
            for i in incidents
        ]


def _why(plan: RecoveryPlan, what: str) -> str:
    return f"recovery at step {plan.step} (leaving: {list(plan.leavers)}): {what}"
