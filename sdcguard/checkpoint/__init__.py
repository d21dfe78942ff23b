"""``sdcguard.checkpoint``: verified checkpoints on ``torch.distributed.checkpoint``.

``save`` / ``load`` (:mod:`sdcguard.checkpoint.dcp`), ``async_save`` and ``AsyncCheckpointer``
(:mod:`sdcguard.checkpoint.asynchronous`), ``scrub`` and ``latest_good`` (:mod:`sdcguard.checkpoint.scrub`) are
defined on the training side; this module is their documented import path.
"""

from .asynchronous import AsyncCheckpointer, async_poll, async_save, async_wait
from .dcp import CheckpointInfo, load, save
from .layout import SIDECAR
from .scrub import ScrubResult, latest_good, scrub, scrub_one

__all__ = [
    "save",
    "load",
    "async_save",
    "async_wait",
    "async_poll",
    "AsyncCheckpointer",
    "CheckpointInfo",
    "scrub",
    "scrub_one",
    "latest_good",
    "ScrubResult",
    "SIDECAR",
]
