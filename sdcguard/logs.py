"""The ``sdcguard`` logger: every part logs under ``sdcguard.<part>`` (``sdcguard.training``, ``sdcguard.checkpoint``,
``sdcguard.scan``, ...), and the training side's records say which rank and step they come from, as torchft's
manager does, so one line out of a job of thousands of ranks names its origin::

    [sdcguard rank 3 step 120] the devices of this job run different setups ...

Nothing is configured here: the application's logging configuration decides where records go. Without one, Python
prints warnings and errors on stderr (its last-resort handler), so what the guard has to say is seen by default;
``logging.getLogger("sdcguard").setLevel(logging.ERROR)`` quiets it. Each record also carries ``rank`` and ``step``
as attributes, for a formatter or a JSON handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["get_logger", "RankLogger"]


def get_logger(part: str) -> logging.Logger:
    """The logger of one part of sdcguard (``sdcguard.<part>``)."""
    return logging.getLogger(f"sdcguard.{part}")


class RankLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose messages begin with ``[sdcguard rank R step S]`` (the step as ``step()`` says it now; left out
    while there is none), with ``rank`` and ``step`` on every record."""

    def __init__(self, logger: logging.Logger, rank: int, step: Callable[[], int | None] = lambda: None) -> None:
        super().__init__(logger, {})
        self.rank = rank
        self._step = step

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        step = self._step()
        where = f"rank {self.rank}" + ("" if step is None else f" step {step}")
        kwargs["extra"] = {**kwargs.get("extra", {}), "rank": self.rank, "step": step}
        return f"[sdcguard {where}] {msg}", kwargs
