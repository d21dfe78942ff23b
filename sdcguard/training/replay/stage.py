"""Watching one pipeline stage (``torch.distributed.pipelining``) as the schedule runs it, and replaying it.

A stage's unit of replay is its own forward and backward of one micro-batch, fed what it was fed: the stage input
(the previous stage's activations, or the batch on the first stage) and the gradient that flowed into the stage
output (the next stage's, or the loss's on the last). Both are captured at the stage boundary, so a replay needs no
other stage: another replica of the stage recomputes it alone, at the cost of one stage forward and backward, where
replaying the whole schedule (torchtitan's choice) costs one schedule of every stage. The stage output is
fingerprinted too (the stage-boundary fingerprint), so a fault in a stage's forward shows there even when no local
gradient changes.

A schedule runs the forwards and backwards of its micro-batches in its own order (GPipe: every forward, then every
backward; 1F1B: interleaved), so :class:`StageObserver` arms the sampled micro-batch's hooks when *its* backward
starts (a hook on its output fires first in it) and disarms them when another micro-batch's starts; a micro-batch
whose backward hands no local gradient over leaves the sample unjudged, as in a plain loop.

Only the schedule knows where a stage's micro-batches start, so a stage's guard (a mesh with a ``pp`` dimension, or
``loss_fn=stage_output`` with a group per stage) is fed by ``watch_stage``: without it the loop's own four calls
would hand the guard the pipeline's batch as the stage's input, and its replays would fail deep inside the stage
(``mat1 and mat2 shapes cannot be multiplied``). Such a guard refuses its first step in one line instead
(:data:`UNWATCHED`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...errors import BadInput
from .capture import Batch
from .observe import Observed, StepObserver

__all__ = ["stage_output", "StageObserver", "stage_tensor", "UNWATCHED"]

UNWATCHED = (
    "this guard watches a pipeline stage: call sdcguard.adapters.pipelining.watch_stage(guard, stage) before the first "
    "step, so the schedule feeds it each micro-batch's stage input and output (the loop's own calls cannot)"
)
"""Why a stage's guard refuses a step nothing feeds (see the module docstring)."""


def stage_output(module: nn.Module, batch: Batch) -> torch.Tensor:
    """The ``loss_fn`` of a pipeline stage: its forward on the inputs it was given (``batch``: the tuple of its
    forward's arguments, as captured), whose output a replay's backward starts from."""
    args = batch if isinstance(batch, tuple) else (batch,)
    return stage_tensor(module(*args))


def stage_tensor(output: Any) -> torch.Tensor:
    """The one tensor a stage's forward returns (a 1-tuple of it too); anything else is refused in one line."""
    if isinstance(output, tuple) and len(output) == 1:
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise BadInput(
            f"a pipeline stage watched by sdcguard returns one tensor from its forward, got {type(output).__name__}"
        )
    return output


class StageObserver(StepObserver):
    """A step observer for a pipeline stage (see the module docstring)."""

    watched = False
    """Whether ``watch_stage`` feeds it; a step begun without it is refused (:data:`UNWATCHED`)."""

    def begin(self, step: int, *, record: bool, chosen: int = 0) -> None:
        if not self.watched:
            raise BadInput(UNWATCHED)
        super().begin(step, record=record, chosen=chosen)
        self._backwards = 0

    def observe_loss(self, loss: torch.Tensor) -> None:
        """The stage output of the micro-batch whose forward just ran (``before_forward`` came first)."""
        index = self._index - 1
        super().observe_loss(loss)  # the sampled micro-batch: its output fingerprinted, its incoming gradient kept
        if loss.requires_grad:
            loss.register_hook(lambda g, i=index: self._backward_starts(i))

    def finish(self) -> Observed | None:
        self._tally_backward()
        return super().finish()

    def _tally(self) -> None:
        """Micro-batches are tallied by backward, not by forward (:meth:`_backward_starts`)."""

    def _tally_backward(self) -> None:
        if self._backwards and self.taps.handed_over == self._count:
            self._silent = True
        self._count = self.taps.handed_over

    def _backward_starts(self, index: int) -> None:
        self._tally_backward()
        self._backwards += 1
        if self._record_here and index == self._chosen and self._record is not None:
            self.taps.arm(self._record)
            self._armed = True
        elif self._armed:
            self.taps.arm(None)
            self._armed = False
