"""A guard's recovery built from its settings, with the setups it cannot re-form refused in one line: the engine is
picked once here (:class:`~.engine.TorchEngine` for DDP jobs and single processes, :class:`~.hsdp.HSDPEngine` for
HSDP), never by a branch in the guard."""

from __future__ import annotations

import os
from collections.abc import Sequence

from torch import nn

from ...errors import BadInput
from ..comm import Comm
from .engine import RecoveryEngine, TorchEngine
from .hsdp import HSDPEngine, hsdp_mesh
from .recover import Recovery
from .remesh import check_remeshable
from .shared import SharedSlots
from .snapshot import SnapshotKeeper
from .state import LiveState, Stateful

__all__ = ["make_recovery"]


def make_recovery(
    escalate: str,
    module: nn.Module,
    optimizer: Stateful | None,
    state: Sequence[Stateful],
    *,
    fsdp: bool,
    meshed: bool,
    workers: Sequence[int],
    replicas: int | None,
    snapshot_dir: str | os.PathLike[str] | None = None,
    rank: int = 0,
) -> Recovery | None:
    """The recovery of a guard whose module is ``module`` (``fsdp``: an FSDP2 module; ``meshed``: its device mesh has
    model-parallel or pipeline dimensions; ``workers``: the job's data-parallel ranks; ``replicas``: its
    ``min_replicas``; ``snapshot_dir``: a node-local shared-memory folder the snapshots survive a restart in,
    :mod:`.shared`, with ``rank`` naming this rank's files); None unless ``escalate="recover"``."""
    if escalate != "recover":
        return None
    if optimizer is None:
        raise BadInput(
            'escalate="recover" needs optimizer= (its state is part of every snapshot; a dedicated shadow passes '
            "one built over its own module's parameters, so it can be promoted)"
        )
    engine = _engine(module, fsdp=fsdp, meshed=meshed, workers=workers)
    shared = None if snapshot_dir is None else SharedSlots(snapshot_dir, rank)
    keeper = SnapshotKeeper(LiveState(module, optimizer, list(state)), shared)
    return Recovery(keeper, engine, min_replicas=replicas)


def _engine(module: nn.Module, *, fsdp: bool, meshed: bool, workers: Sequence[int]) -> RecoveryEngine:
    """The engine that re-forms this job, or the one-line refusal of a layout none re-forms."""
    refused = (
        'escalate="recover" re-forms DDP jobs, HSDP jobs (FSDP2 over a replicate x shard mesh) and single processes'
    )
    if meshed:
        raise BadInput(
            f"{refused}; device meshes with model-parallel or pipeline dimensions are not supported yet: use "
            'escalate="exit"'
        )
    if not fsdp:
        return TorchEngine(Comm())
    why = check_remeshable(module)
    if why is None:
        mesh = hsdp_mesh(module)
        if sorted(int(r) for r in mesh.mesh.reshape(-1).tolist()) != sorted(workers):
            why = "its mesh is not the whole job"
    if why is not None:
        raise BadInput(f'{refused}; this FSDP2 module cannot be re-formed ({why}): use escalate="exit"')
    return HSDPEngine(Comm(), module, mesh)
