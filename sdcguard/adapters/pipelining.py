"""Pipeline stages (``torch.distributed.pipelining``): the guard watches a stage as the schedule runs it.

The schedule runs the stage's module once per micro-batch through ``PipelineStage.forward_maybe_with_nosync``
(its metadata inference, on the first step, runs the module another way and is not watched); :func:`watch_stage`
wraps that call so each micro-batch tells the guard where it starts (the stage's inputs) and which tensor its
backward starts from (the stage's output). The loop makes the other two calls::

    guard = sdcguard.SDCGuard(stage_module, sdcguard.stage_output, mesh=mesh)  # mesh dims ("dp", "pp")
    watch_stage(guard, stage)
    for step, (x, y) in enumerate(data):
        guard.begin_step(step, micro_batches=n_microbatches)
        schedule.step(x) if first else schedule.step(target=y, losses=losses) if last else schedule.step()
        report = guard.end_step()  # every stage of every replica decides alike
        if report.commit:
            optimizer.step()
        optimizer.zero_grad()

A stage's guard that nothing watches refuses its first step in one line (its replays would be fed the pipeline's
batch). A stage is replayed alone, by another replica of the same stage, fed the input and output gradient it captured
(:mod:`sdcguard.training.replay.stage`).
"""

from __future__ import annotations

from typing import Any

from ..errors import BadInput
from ..training.guard import SDCGuard
from ..training.replay.stage import stage_tensor

__all__ = ["watch_stage", "StageHooks"]


class StageHooks:
    """The watch :func:`watch_stage` put on a stage; :meth:`remove` takes it off."""

    def __init__(self, guard: SDCGuard, stage: Any) -> None:
        self.guard = guard
        self.stage = stage
        self._original = stage.forward_maybe_with_nosync
        stage.forward_maybe_with_nosync = self._forward
        guard.watch_stage()

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        watched = self.guard.observing and not self.guard.replaying
        if watched:
            self.guard.before_forward(tuple(args))
        out = self._original(*args, **kwargs)
        if watched:
            self.guard.observe_loss(stage_tensor(out))
        return out

    def remove(self) -> None:
        if self.stage.forward_maybe_with_nosync == self._forward:
            self.stage.forward_maybe_with_nosync = self._original
            self.guard.watch_stage(False)


def watch_stage(guard: SDCGuard, stage: Any) -> StageHooks:
    """Watch the ``PipelineStage`` ``stage`` whose module ``guard`` guards (``SDCGuard(stage.submod, ...)``)."""
    if stage.submod is not guard.model:
        raise BadInput("watch_stage: the guard must guard the stage's module (SDCGuard(stage.submod, ...))")
    return StageHooks(guard, stage)
