""":meth:`SDCGuard.step <sdcguard.training.guard.SDCGuard.step>`'s micro-batches: the four calls made for a plain
loop (each micro-batch's forward under DDP's ``no_sync`` but the last, its loss observed, its backward), split from
:mod:`.guard` by job. A failure inside the step abandons it (:meth:`~.guard.SDCGuard.abandon_step`), so the next
step starts clean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import BadInput
from .config import StepReport
from .replay.capture import Batch
from .replay.recompute import LossFn, check_loss

__all__ = ["Stepped", "micro_batches_of", "run_micro_batches"]


class Stepped(Protocol):
    """What the loop needs of the guard: its four calls, the abandon, the model and ``loss_fn``."""

    model: nn.Module
    loss_fn: LossFn

    def begin_step(self, step: int, *, micro_batches: int = 1) -> None: ...
    def before_forward(self, batch: Batch) -> None: ...
    def observe_loss(self, loss: torch.Tensor) -> None: ...
    def end_step(self, *, loss: torch.Tensor | None = None) -> StepReport: ...
    def abandon_step(self) -> None: ...


def run_micro_batches(
    guard: Stepped,
    step: int,
    micro_batches: Sequence[Batch],
    *,
    ddp: Any,
    context: Callable[[], contextlib.AbstractContextManager[object]],
) -> StepReport:
    """Forward and backward of ``micro_batches`` (each loss divided by their number; ``ddp``: the DDP model that
    synchronises on the last one, or None), run in ``context``, then ``guard.end_step``."""
    n = len(micro_batches)
    guard.begin_step(step, micro_batches=n)
    losses = []
    try:
        for i, mb in enumerate(micro_batches):
            last = i == n - 1
            no_sync = ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()
            with no_sync, context():
                guard.before_forward(mb)
                loss = check_loss(guard.loss_fn(guard.model, mb))
                guard.observe_loss(loss)
                (loss / n if n > 1 else loss).backward()
            losses.append(loss.detach())
    except BaseException:
        guard.abandon_step()
        raise
    return guard.end_step(loss=losses[0] if n == 1 else torch.stack(losses).mean())


def micro_batches_of(batch: Batch, micro_batches: Sequence[Batch] | None) -> list[Batch]:
    """``guard.step``'s one ``batch`` or its ``micro_batches``, as a list (exactly one of them, not empty)."""
    if (batch is None) == (micro_batches is None):
        raise BadInput("pass exactly one of batch or micro_batches")
    mbs = [batch] if micro_batches is None else list(micro_batches)
    if not mbs:
        raise BadInput("micro_batches is empty")
    return mbs
