"""The :class:`~.engine.RecoveryEngine` of an HSDP job (FSDP2 over a 2-D ``(replicate, shard)`` device mesh):
:class:`HSDPEngine`. One replica is one row of the mesh, one rank per shard; the ranks of a column hold the same
shard and are each other's replicas.

- ``replicas``: the mesh's rows. A replica leaves whole (:func:`~.plan.plan_recovery`): a replica missing one shard
  cannot go on, so the healthy ranks of a suspect's row are *released* (they exit 85, the suspect 86).
- ``exclude``: a new device mesh over the rows that stay (the same dimension names; every rank of the job creates
  it, leavers included), and the new data-parallel group of its ranks (numbered by place: the order gloo and
  NCCL's ring sum in). Every rank that stays keeps its shard coordinate, so its local shards stay what they were.
- ``heal``: the snapshots are voted on per column (each rank's snapshot is its own shard): the holders of one shard
  confirm it, and one of them sends it to a rank of that column that lacks it.
- ``promote``: the same FSDP2 module moved onto the new mesh (:mod:`.remesh`); FSDP2 rebuilds no buckets, so there
  is no warm-up.
- ``roll_back``: the snapshot written into the live state; the optimizer's ``DTensor`` state lands on the mesh the
  parameters are on now (:class:`~.state.ShardSlot`).

No spares: dedicated shadows replay a whole model on one device and are refused with a mesh or FSDP2
(:func:`~sdcguard.training.rounds.roles.join_job`), so an HSDP job goes on with fewer replicas when ``min_replicas``
allows, else every rank exits by the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from torch import nn

from ..comm import Comm
from ..hooks.fsdp import fsdp_param_groups
from .engine import Healed, heal_by_class
from .plan import RecoveryPlan
from .remesh import remesh
from .snapshot import Snapshot, SnapshotKeeper

__all__ = ["HSDPEngine", "hsdp_mesh"]


def hsdp_mesh(module: nn.Module) -> Any:
    """The device mesh ``module``'s FSDP2 parameter groups reduce over (the root's; :func:`~.remesh.remesh` checks
    that every group has it)."""
    return fsdp_param_groups(cast(Any, module))[0].mesh_info.mesh


class HSDPEngine:
    """:class:`~.engine.RecoveryEngine` of an HSDP job (see the module docstring).

    Args:
        world: every rank of the job.
        module: the FSDP2 module (the root ``fully_shard`` module).
        mesh: its ``(replicate, shard)`` mesh.
    """

    def __init__(self, world: Comm, module: nn.Module, mesh: Any) -> None:
        self.world, self.module, self.mesh = world, module, mesh
        self._next: Any = None
        """The mesh :meth:`exclude` made, until :meth:`promote` moves the module onto it."""

    @staticmethod
    def _rows(mesh: Any) -> list[tuple[int, ...]]:
        return [tuple(int(r) for r in row) for row in mesh.mesh.tolist()]

    def replicas(self, workers: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        return tuple(row for row in self._rows(self.mesh) if set(row) <= set(workers))

    def exclude(self, plan: RecoveryPlan) -> Comm | None:
        rows = [row for row in self._rows(self.mesh) if set(row) <= set(plan.members)]
        self._next = self.world.reform_mesh(self.mesh, rows)
        return self.world.reform(plan.members)

    def heal(self, comm: Comm, mine: Snapshot | None, batch: Any) -> Healed:
        rows = self._rows(self._next if self._next is not None else self.mesh)
        columns = [[comm.members.index(row[j]) for row in rows] for j in range(len(rows[0]))]
        return heal_by_class(comm, mine, batch, columns)

    def promote(self, comm: Comm, model: nn.Module, module: nn.Module, warm: Callable[[nn.Module], None]) -> nn.Module:
        if self._next is not None:
            remesh(module, self._next)
            self.mesh, self._next = self._next, None
        return model

    def roll_back(self, keeper: SnapshotKeeper, snapshot: Snapshot) -> None:
        keeper.restore(snapshot)
