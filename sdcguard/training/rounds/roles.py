"""Who does what in a job with dedicated shadows: the data-parallel workers (the first ranks) and the shadows (the
last ranks), and the workers' process group. Built once, collectively, before the guard."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch.distributed as dist

from ...errors import BadInput
from ..comm import Comm

__all__ = ["Role", "Roles", "plan_roles", "worker_group", "join_job"]

Role = Literal["worker", "shadow"]


@dataclass(frozen=True, kw_only=True)
class Roles:
    """The roles of a job with dedicated shadows (see :func:`plan_roles`)."""

    workers: tuple[int, ...]
    """Global ranks of the data-parallel workers (``0 .. W-1``)."""
    shadows: tuple[int, ...]
    """Global ranks of the dedicated shadows (the last ranks)."""
    role: Role
    """This process's role."""
    dp_group: Any = field(default=None, repr=False)
    """The workers' process group (on a shadow, torch's non-member placeholder: pass it to ``SDCGuard`` all the
    same, so that no rank builds the group a second time)."""

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("a job needs at least one worker")
        if set(self.workers) & set(self.shadows):
            raise ValueError("a rank cannot be both a worker and a shadow")


def plan_roles(num_shadows: int, *, world_size: int | None = None, rank: int | None = None) -> Roles:
    """Split the world into workers (the first ranks) and ``num_shadows`` dedicated shadows (the last ranks).

    Call it on every rank right after ``init_process_group``: it creates the data-parallel group collectively.
    Pass ``roles.dp_group`` to DDP and to ``SDCGuard(group=...)``, and ``list(roles.shadows)`` as ``shadows=``.
    """
    world = world_size if world_size is not None else dist.get_world_size()
    me = rank if rank is not None else dist.get_rank()
    if not 0 <= num_shadows < world:
        raise ValueError(f"need 0 <= num_shadows < world size ({world}), got {num_shadows}")
    workers = tuple(range(world - num_shadows))
    shadows = tuple(range(world - num_shadows, world))
    group = dist.new_group(ranks=list(workers)) if dist.is_initialized() else None
    role: Role = "shadow" if me in shadows else "worker"
    return Roles(workers=workers, shadows=shadows, role=role, dp_group=group)


def worker_group(shadows: Literal["peer"] | tuple[int, ...], group: Any) -> tuple[Role, tuple[int, ...], Comm]:
    """This rank's role, the shadow ranks and the workers' :class:`Comm` for a guard built with ``shadows``.

    With dedicated shadows every rank of the world (shadows too) must call it: it may create the workers' group.
    """
    if shadows == "peer":
        return "worker", (), Comm(group)
    if not (dist.is_available() and dist.is_initialized()):
        raise BadInput("dedicated shadows need torch.distributed to be initialised")
    world = dist.get_world_size()
    if any(r >= world for r in shadows):
        raise BadInput(f"shadow ranks {list(shadows)} are not all below the world size {world}")
    workers = [r for r in range(world) if r not in shadows]
    if not workers:
        raise BadInput("every rank is a shadow: at least one worker is needed")
    if group is None:  # collective over the world
        group = dist.new_group(ranks=workers)
    role: Role = "shadow" if dist.get_rank() in shadows else "worker"
    if role == "worker" and dist.get_process_group_ranks(group) != workers:
        raise BadInput("with dedicated shadows, group must hold exactly the non-shadow ranks")
    return role, tuple(shadows), Comm(group if role == "worker" else None, members=workers)


def join_job(
    shadows: Literal["peer"] | tuple[int, ...], group: Any, ranks: list[int] | None
) -> tuple[Role, tuple[int, ...], Comm]:
    """A guard's role, the shadow ranks and the job's group: that of the step's gather (under a device mesh the
    mesh's ranks, ``ranks``; else the data-parallel workers: :func:`worker_group`)."""
    if ranks is None:
        return worker_group(shadows, group)
    if shadows != "peer":
        raise BadInput("dedicated shadows replay a whole model on one device: use peer mode with a device mesh")
    return "worker", (), Comm.of(ranks)
