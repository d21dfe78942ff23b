"""A slow rank for training drills: every aten op this thread runs takes ``factor`` times its own time.

``SlowOpsMode(factor=1.5)`` is a ``TorchDispatchMode``: each op runs, then the same op runs again (its result
discarded) as many whole times as fit, then the thread spins for the rest (:func:`sdcguard.cpu_time.slow_down`),
so the device really does more work, as a throttled one would; nothing sleeps. Ops that write into an argument (in
place, ``out=``) are never repeated (that would change the result): they only spin. The results are bit for bit
the ones without the mode. CPU only (on CUDA the ops are asynchronous; this thread's time would not be the device's).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..cpu_time import burn_cpu, slow_down

__all__ = ["SlowOpsMode"]


def _mutates(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is None or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


class SlowOpsMode(TorchDispatchMode):
    """Make this thread's aten ops ``factor`` times slower (``with SlowOpsMode(1.5): ...``)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        if not factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.factor = float(factor)
        self.ops = 0
        """Ops slowed so far."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        t0 = time.thread_time()
        out = func(*args, **kwargs)
        if self.factor > 1.0:
            self.ops += 1
            if _mutates(func):
                burn_cpu((self.factor - 1.0) * (time.thread_time() - t0))
            else:
                with torch.no_grad():
                    slow_down(lambda: func(*args, **kwargs), started=t0, factor=self.factor)
        return out
