"""A guard's recovery built from its settings, with the setups it cannot re-form refused in one line."""

from __future__ import annotations

import os
from collections.abc import Sequence

from torch import nn

from ...errors import BadInput
from ..comm import Comm
from .engine import TorchEngine
from .recover import Recovery
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
    sharded: bool,
    replicas: int | None,
    snapshot_dir: str | os.PathLike[str] | None = None,
    rank: int = 0,
) -> Recovery | None:
    """The recovery of a guard whose module is ``module`` (``sharded``: FSDP2 or a device mesh; ``replicas``: its
    ``min_replicas``; ``snapshot_dir``: a node-local shared-memory folder the snapshots survive a restart in,
    :mod:`.shared`, with ``rank`` naming this rank's files); None unless ``escalate="recover"``."""
    if escalate != "recover":
        return None
    if optimizer is None:
        raise BadInput(
            'escalate="recover" needs optimizer= (its state is part of every snapshot; a dedicated shadow passes '
            "one built over its own module's parameters, so it can be promoted)"
        )
    if sharded:
        raise BadInput(
            'escalate="recover" re-forms DDP jobs and single processes; FSDP2/HSDP and device meshes are not '
            'supported yet: use escalate="exit"'
        )
    shared = None if snapshot_dir is None else SharedSlots(snapshot_dir, rank)
    keeper = SnapshotKeeper(LiveState(module, optimizer, list(state)), shared)
    return Recovery(keeper, TorchEngine(Comm()), min_replicas=replicas)
