"""Hugging Face adapter: :class:`SDCGuardTrainerCallback` checks every optimizer step of a ``Trainer``.

The ``Trainer`` runs forward and backward itself and callbacks do not see the batch, so the callback records the
inputs of the model's last training forward by name (a forward pre-hook) and the random state just before it, and
in ``on_pre_optimizer_step`` (gradients accumulated and clipped) calls :meth:`SDCGuard.check`: reduced gradients
compared across replicas and, on sampled steps, the last micro-batch replayed by a peer or a dedicated shadow. A
vetoed step has its gradients dropped, so the optimizer step changes nothing::

    cb = SDCGuardTrainerCallback(replay_every=50, store="fleet.db")
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    cb.guard.incidents
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from transformers import TrainerCallback

from ..capture import capture_rng
from ..guard import SDCGuard, StepReport
from ..replay import LossFn

__all__ = ["SDCGuardTrainerCallback", "model_output_loss"]


def model_output_loss(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """Default loss: the model's own ``loss`` output for the keyword inputs (``labels`` included)."""
    return model(**batch).loss


class SDCGuardTrainerCallback(TrainerCallback):
    """Runs :class:`SDCGuard` checks on a Hugging Face ``Trainer`` (keyword arguments go to ``SDCGuard``)."""

    def __init__(self, loss_fn: LossFn | None = None, **guard_kwargs: Any) -> None:
        self.loss_fn = loss_fn or model_output_loss
        self.guard_kwargs = guard_kwargs
        self.guard: SDCGuard | None = None
        self.last_report: StepReport | None = None
        self._batch: dict[str, Any] | None = None
        self._rng: Any = None
        self._checking = False
        self._hook: Any = None

    def _capture(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Only real training forwards: not evaluation, not the guard's own replays.
        if not (module.training and torch.is_grad_enabled()) or self._checking:
            return
        if args:
            # A positional call (a custom compute_loss): name the arguments, so the batch stays the keyword
            # inputs that model_output_loss (and a user's loss_fn) passes back as model(**batch).
            kwargs = dict(inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments)
        self._batch = dict(kwargs)
        self._rng = capture_rng(self.guard.rng_hook if self.guard else None)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.guard is None:
            self.guard = SDCGuard(model, self.loss_fn, **self.guard_kwargs)
            # On the module the guard replays (the Trainer passes the unwrapped model; a DDP wrapper's forward
            # calls this one's, so its hook still fires).
            self._hook = self.guard.module.register_forward_pre_hook(self._capture, with_kwargs=True)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is None:
            return
        if self._batch is None:
            # Never silently unchecked: the Trainer ran no training forward of the model the guard watches.
            warnings.warn("SDCGuardTrainerCallback saw no training forward of the model before an optimizer "
                          "step: that step is not checked", RuntimeWarning, stacklevel=2)
            return
        self._checking = True
        try:
            report = self.guard.check(state.global_step, self._batch, rng=self._rng)
        finally:
            self._checking = False
            self._batch = None  # a later step without a captured forward must not re-check this one
        self.last_report = report
        if not report.commit:
            for p in self.guard.module.parameters():
                p.grad = None  # the optimizer skips parameters without gradients: the step is vetoed

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.after_optimizer_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.close()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
