"""``sdcguard.checkpoint.save`` / ``load``: verified checkpoints on ``torch.distributed.checkpoint``.

Defined in :mod:`sdcguard.training.checkpoint` (the training side); this module is their documented import path.
"""

from .training.checkpoint import SIDECAR, CheckpointInfo, load, save

__all__ = ["save", "load", "CheckpointInfo", "SIDECAR"]
