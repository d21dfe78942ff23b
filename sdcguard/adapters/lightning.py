"""Lightning adapter: :class:`SDCGuardCallback` checks every optimizer step of a ``Trainer`` with the guard.

Lightning runs forward and backward itself, so the callback uses :meth:`SDCGuard.check`: it remembers each
micro-batch and the random state before it (``on_train_batch_start``), and in ``on_before_optimizer_step``
(gradients accumulated and unscaled, not yet clipped) compares the reduced gradients across replicas and, on
sampled steps, has a peer or a dedicated shadow replay the last micro-batch. A vetoed step has its gradients
dropped, so the optimizer step changes nothing::

    guard_cb = SDCGuardCallback(replay_every=50, store="fleet.db")
    trainer = L.Trainer(strategy="ddp", callbacks=[guard_cb])
    guard_cb.guard.incidents   # after (or during) fit
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from ..capture import capture_rng
from ..guard import SDCGuard, StepReport
from ..replay import LossFn

__all__ = ["SDCGuardCallback", "training_step_loss"]


def training_step_loss(module: Any, batch: Any) -> torch.Tensor:
    """Default loss: the LightningModule's own ``training_step`` (a tensor, or a dict with ``"loss"``)."""
    out = module.training_step(batch, 0)
    return out["loss"] if isinstance(out, dict) else out


class SDCGuardCallback(Callback):
    """Runs :class:`SDCGuard` checks on a Lightning ``Trainer`` (keyword arguments go to ``SDCGuard``)."""

    def __init__(self, loss_fn: LossFn | None = None, **guard_kwargs: Any) -> None:
        self.loss_fn = loss_fn or training_step_loss
        self.guard_kwargs = guard_kwargs
        self.guard: SDCGuard | None = None
        self.last_report: StepReport | None = None
        self._batch: Any = None
        self._rng: Any = None
        self._state: dict[str, Any] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self.guard is None:
            self.guard = SDCGuard(pl_module, self.loss_fn, **self.guard_kwargs)
            if self._state is not None:
                self.guard.load_state_dict(self._state)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch = batch
        self._rng = capture_rng(self.guard.rng_hook if self.guard else None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        assert self.guard is not None, "SDCGuardCallback.setup did not run"
        report = self.guard.check(trainer.global_step, self._batch, rng=self._rng)
        self.last_report = report
        if not report.commit:
            for p in pl_module.parameters():
                p.grad = None  # the optimizer skips parameters without gradients: the step is vetoed

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.guard is not None:
            self.guard.after_optimizer_step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.guard is not None:
            self.guard.close()

    def state_dict(self) -> dict[str, Any]:
        return self.guard.state_dict() if self.guard is not None else (self._state or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._state = dict(state_dict) or None
        if self.guard is not None and self._state:
            self.guard.load_state_dict(self._state)
