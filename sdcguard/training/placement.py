"""Where a guard's rank stands in the job, found once at construction (one gather of every rank's identity): its
role, the group of the step's gather (``job_comm``), its data-parallel group (``comm``), the job's layout and the
parameters' replica classes. Split from :mod:`.guard` by job: a pure result of the model, the groups and the mesh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ..errors import BadInput
from .comm import Comm
from .hooks.taps import Taps
from .identity import JobView, introduce, launcher_job_id, new_job_id, parameter_signature
from .mesh import (
    EXPERT_DIMS,
    STAGE_DIMS,
    Layout,
    build_layout,
    check_mesh_group,
    mesh_coordinates,
    mesh_ranks,
    replica_classes,
)
from .replica import fingerprint_column
from .rounds.roles import Role, join_job

__all__ = ["Placement", "place", "refuse_plain_experts"]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where one rank stands (see the module docstring)."""

    role: Role
    shadow_ranks: tuple[int, ...]
    job_comm: Comm
    """The group of the step's one gather (every data-parallel rank; with a mesh, every rank of the mesh)."""
    comm: Comm
    """This rank's data-parallel group."""
    layout: Layout
    """The job's ranks grouped for the checks (:mod:`.mesh`): who compares and who replays whom."""
    view: JobView
    """Every rank's identity, setup and coordinates."""
    classes: list[int]
    """The replica class of every parameter (trained, then frozen)."""
    frozen: list[tuple[str, nn.Parameter]]
    """Parameters nothing trains (a LoRA job's base): in the weight check (:class:`~.replica.WeightCheck`)."""


def place(
    shadows: Literal["peer"] | tuple[int, ...],
    group: Any,
    mesh: Any,
    *,
    taps: Taps,
    module: nn.Module,
    device: torch.device,
    reduced: bool,
) -> Placement:
    """This rank's :class:`Placement` (collective over the job; ``reduced``: FSDP2 or the user's DDP reduce the
    gradients of a meshed model)."""
    params: Sequence[nn.Parameter] = list(taps.params)
    coords = mesh_coordinates(params, mesh)
    role, shadow_ranks, job_comm = join_job(shadows, group, mesh_ranks(params, mesh))
    frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
    classes, keys = replica_classes([*params, *(p for _, p in frozen)])
    stage = tuple((d, c) for d, c in coords if d in STAGE_DIMS)
    keys = tuple(tuple(sorted((*k, *stage))) for k in keys)  # a pipeline stage's replicas hold the same layers
    world = Comm() if shadow_ranks else job_comm
    signature = parameter_signature(list(zip(taps.param_names, params)))
    view = introduce(world, device, keys, launcher_job_id() or new_job_id(), coords, signature)
    if not coords and role == "worker" and len({view.ranks[g].params for g in job_comm.members}) > 1:
        raise BadInput(
            "the ranks hold different parameters, so they are not replicas of each other (pipeline stages?): "
            "guard each set of replicas with group= its process group (one group per pipeline stage)"
        )
    if not coords and role == "worker" and job_comm.size > 1:
        refuse_plain_experts(job_comm, taps.param_names, params, device)
    layout = (
        build_layout(job_comm.members, view.coordinates)
        if coords
        else Layout(ranks=tuple(job_comm.members), slices=(tuple(job_comm.members),))
    )
    if coords:  # refused before the groups are made: a rank that leaves early would break the others' new_group
        mine = next(s for s in layout.slices if job_comm.rank in s)
        expert = any(d in EXPERT_DIMS for d, _ in coords)
        check_mesh_group(group, mine, params, layout.width, reduced, expert)
    comm = job_comm.split(layout.slices) if coords else job_comm
    return Placement(
        role=role,
        shadow_ranks=tuple(shadow_ranks),
        job_comm=job_comm,
        comm=comm,
        layout=layout,
        view=view,
        classes=classes,
        frozen=frozen,
    )


def refuse_plain_experts(
    comm: Comm, names: Sequence[str], params: Sequence[torch.Tensor], device: torch.device
) -> None:
    """Without a mesh every rank is taken to hold the same parameters. Ranks that hold the same values of some
    parameters and different values of others at construction hold experts as plain tensors (expert parallelism with
    no mesh to say so), which would be compared as replicas: refused in one line (collective over ``comm``: one
    gather of a fingerprint per parameter). Ranks that differ everywhere are an unseeded model that DDP's broadcast
    makes alike; ranks alike everywhere are replicas."""
    rows = comm.gather_ints(fingerprint_column(params, device)).tolist()
    same = [len({row[j] for row in rows}) == 1 for j in range(len(names))]
    differ = [n for n, s in zip(names, same, strict=True) if not s]
    if differ and len(differ) < len(names):
        more = f" and {len(differ) - 1} more" if len(differ) > 1 else ""
        raise BadInput(
            f"the ranks hold different values of {differ[0]}{more} but the same values of every other parameter "
            "(experts held as plain tensors?): sdcguard would compare them as replicas. Give expert parameters a "
            "mesh (DTensors sharded over an 'ep' dimension) and pass SDCGuard(mesh=...)"
        )
