"""The engine that re-forms a job after a recovery decision, behind one small interface, so another engine
(torchft's replica groups, NCCL's ``shrink_group`` on a GPU) is one more implementation, never a branch in the
guard: :class:`RecoveryEngine`. :class:`TorchEngine` is plain ``torch.distributed`` (gloo on CPUs, NCCL on GPUs)
for DDP jobs and single processes; :class:`~.hsdp.HSDPEngine` re-forms an HSDP job over a new device mesh.
torchft's replica groups have the same verbs at the points torchft gives them (a per-step quorum, heal callbacks),
not this interface's job-wide calls: :class:`~.torchft.TorchFTEngine`, which says why.

- ``replicas``: the workers grouped by replica (one rank each here): a replica leaves whole.
- ``exclude``: a new data-parallel group without the leavers and with the promoted spares, in data-rank order
  (every rank of the job calls it: :meth:`~sdcguard.training.comm.Comm.reform`).
- ``heal``: every member ends holding the verified snapshot. The members' snapshots are voted on
  (:func:`~.vote.confirmed`: a strict majority of the members that held one; per class of members holding the same
  state, :func:`heal_by_class`: one class here, one per shard under HSDP); one holder sends it to every member
  that lacks it (a promoted spare, or a replica whose copy differs), and a receiver keeps it only when the bits it
  received have the fingerprints the sender had, and their digest is the voted one.
- ``promote``: the model for the new group: the old DDP wrapper's hooks taken off, a new DDP over the new group,
  *warmed* with one forward and backward of a batch (its gradients, buffers and random states thrown away), so that
  its first real step uses the buckets a fault-free run's DDP has rebuilt by then (a new DDP buckets in parameter
  order, then rebuilds in the order gradients arrived: the two sum elements in different orders).
- ``roll_back``: write the snapshot into the live state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ..comm import Comm, recv_tensors_, send_tensors
from ..hooks.ddp import is_ddp, release_ddp, wrap_ddp
from .plan import RecoveryPlan
from .snapshot import Snapshot, SnapshotKeeper, snapshot_fingerprints
from .state import state_digest
from .vote import State, confirmed

__all__ = ["RecoveryEngine", "TorchEngine", "Healed", "heal_by_class"]


@dataclass(frozen=True, kw_only=True)
class Healed:
    """What a heal left on one member."""

    snapshot: Snapshot | None
    """The verified snapshot this member now holds (None: the vote found none, or what arrived did not verify)."""
    state: State | None
    """The state the members voted for (None: no majority)."""
    received: bool = False
    """This member received it (it lacked it or held another)."""
    batch: Any = None
    """A batch for the new model's warm-up (this member's last one, or the source's)."""


class RecoveryEngine(Protocol):
    """Re-forms the job (see the module docstring). Every method is called by every rank it names, alike."""

    def replicas(self, workers: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The workers grouped by replica, in data order: a replica leaves whole (:func:`~.plan.plan_recovery`)."""

    def exclude(self, plan: RecoveryPlan) -> Comm | None:
        """The new data-parallel group (None on a rank outside it); every rank of the job calls it."""

    def heal(self, comm: Comm, mine: Snapshot | None, batch: Any) -> Healed:
        """Every member of ``comm`` ends holding the snapshot a strict majority of the holders of its shard agree on
        (every member holds the same state under DDP)."""

    def promote(self, comm: Comm, model: nn.Module, module: nn.Module, warm: Callable[[nn.Module], None]) -> nn.Module:
        """The model the loop trains in the new group (``warm(model)`` runs one forward and backward)."""

    def roll_back(self, keeper: SnapshotKeeper, snapshot: Snapshot) -> None:
        """Write ``snapshot`` into the live state."""


class TorchEngine:
    """:class:`RecoveryEngine` on plain ``torch.distributed`` (see the module docstring)."""

    def __init__(self, world: Comm) -> None:
        self.world = world

    def exclude(self, plan: RecoveryPlan) -> Comm | None:
        return self.world.reform(plan.members)

    def replicas(self, workers: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        return tuple((w,) for w in workers)

    def heal(self, comm: Comm, mine: Snapshot | None, batch: Any) -> Healed:
        return heal_by_class(comm, mine, batch, [list(range(comm.size))])

    def promote(self, comm: Comm, model: nn.Module, module: nn.Module, warm: Callable[[nn.Module], None]) -> nn.Module:
        if is_ddp(model):
            release_ddp(model)
        if comm.alone:
            return module
        ddp = wrap_ddp(module, comm.group)
        warm(ddp)
        return ddp

    def roll_back(self, keeper: SnapshotKeeper, snapshot: Snapshot) -> None:
        keeper.restore(snapshot)


def warm_up(
    loss_fn: Callable[[nn.Module, Any], torch.Tensor], batch: Any, params: list[nn.Parameter]
) -> Callable[[nn.Module], None]:
    """The warm-up :meth:`TorchEngine.promote` runs: one forward and backward of ``batch`` through the new model,
    with the random states put back and the gradients dropped (a rollback then writes the buffers back)."""

    def warm(model: nn.Module) -> None:
        cpu = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            loss_fn(model, batch).backward()
        finally:
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
            for p in params:
                p.grad = None

    return warm


def heal_by_class(comm: Comm, mine: Snapshot | None, batch: Any, classes: Sequence[Sequence[int]]) -> Healed:
    """:meth:`RecoveryEngine.heal` where ``classes`` (members' indices in ``comm``, each member in one) hold the same
    state: the members' snapshots are voted on within each class; one holder of each class sends it to the members of
    its class that lack it. The whole job goes on only when every class has a voted state (else every member's
    :attr:`Healed.state` is None, so every rank exits alike). Every member calls the same collectives in the same
    order: the decisions come from one gather."""
    held = None if mine is None else (mine.step, mine.finish().digest)
    values: list[tuple[State | None, bool]] = comm.gather_objects((held, batch is not None))
    states = [v for v, _ in values]
    voted = [confirmed([states[i] for i in c], voters=sum(states[i] is not None for i in c)) for c in classes]
    if any(v is None for v in voted):
        return Healed(snapshot=None, state=None, batch=batch)
    mine_class = next(k for k, c in enumerate(classes) if comm.index in c)
    healed = Healed(snapshot=mine, state=voted[mine_class], batch=batch)
    for c, state in zip(classes, voted):
        lacking = [i for i in c if states[i] != state]
        if not lacking and all(values[i][1] for i in c):
            continue
        got = _send_state(comm, mine, batch, c[[states[i] for i in c].index(state)], lacking, state)
        if comm.index in c:
            healed = got
    return healed


def _send_state(
    comm: Comm, mine: Snapshot | None, batch: Any, source: int, lacking: Sequence[int], state: State | None
) -> Healed:
    """The voted ``state`` from member ``source`` to the members ``lacking`` it (every member calls it)."""
    # What the receivers need to allocate and check comes as one small object (step, skeleton, the tensors' shapes
    # and dtypes, the source's fingerprints, a warm-up batch); the tensors themselves go point to point from the
    # source to each member that lacks the state, as tensors (no pickle of the weights).
    header = None
    if comm.index == source and mine is not None:
        header = (mine.step, mine.skeleton, [(t.shape, t.dtype) for t in mine.tensors], mine.fingerprints, batch)
    step, skeleton, layout, fingerprints, their_batch = comm.broadcast_object(header, src=source)
    if comm.index == source and mine is not None:
        for i in lacking:
            for work in send_tensors([t for t in mine.tensors if t.numel()], comm.members[i]):
                work.wait()
    if comm.index not in lacking:
        return Healed(snapshot=mine, state=state, batch=batch if batch is not None else their_batch)
    tensors = [torch.empty(shape, dtype=dtype) for shape, dtype in layout]
    recv_tensors_([t for t in tensors if t.numel()], comm.members[source])
    fps = snapshot_fingerprints(tensors)  # what arrived, against what the source sent
    got = Snapshot(step=step, skeleton=skeleton, tensors=tensors, fingerprints=fps, digest=state_digest(fps, skeleton))
    ok = fps == list(fingerprints) and (got.step, got.digest) == state
    return Healed(snapshot=got if ok else None, state=state, received=True, batch=their_batch)
