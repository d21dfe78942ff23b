"""``from sdcguard.adapters.lightning import SDCGuardCallback`` (defined in
:mod:`sdcguard.training.adapters.lightning`)."""

from ..training.adapters.lightning import (
    SDCGuardCallback,
    SDCGuardCheckpointIO,
    SDCGuardModelParallelStrategy,
    training_step_loss,
)

__all__ = ["SDCGuardCallback", "SDCGuardCheckpointIO", "SDCGuardModelParallelStrategy", "training_step_loss"]
