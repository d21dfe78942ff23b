"""``sdcguard.checkpoint``: verified checkpoints on ``torch.distributed.checkpoint``.

``save`` / ``load`` (:mod:`sdcguard.training.checkpoint`), ``async_save`` and ``AsyncCheckpointer``
(:mod:`sdcguard.training.async_checkpoint`), ``scrub`` and ``latest_good`` (:mod:`sdcguard.training.scrub`) are
defined on the training side; this module is their documented import path.
"""

from .training.async_checkpoint import AsyncCheckpointer, async_poll, async_save, async_wait
from .training.checkpoint import CheckpointInfo, load, save
from .training.layout import SIDECAR
from .training.scrub import ScrubResult, latest_good, scrub, scrub_one

__all__ = ["save", "load", "async_save", "async_wait", "async_poll", "AsyncCheckpointer", "CheckpointInfo",
           "scrub", "scrub_one", "latest_good", "ScrubResult", "SIDECAR"]
