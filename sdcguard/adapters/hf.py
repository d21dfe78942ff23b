"""Hugging Face adapter: :class:`SDCGuardTrainerCallback` watches every optimizer step of a ``Trainer``.

The guard observes the step the ``Trainer`` runs (through Accelerate's DDP, or FSDP2): its hooks fingerprint the
local gradients of the sampled micro-batch in the Trainer's own backward, and the gradients the optimizer reads.
Callbacks do not see the batch or the loss, so the callback records the model's training forwards itself (a forward
pre-hook: the keyword inputs, positional ones named; a forward hook: the model's ``loss`` output, whose gradient is
the seed a replay starts from, whatever the Trainer divides or scales it by), and ends the step in
``on_pre_optimizer_step`` (gradients accumulated and clipped). A vetoed step has its gradients dropped, so the
optimizer step changes nothing::

    cb = SDCGuardTrainerCallback(replay_every=50, store="fleet.db")
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    cb.guard.incidents

The model must compute its own loss (pass ``labels``): a replay recomputes ``model(**inputs)`` and reads its loss as
the ``Trainer`` does (``output["loss"]`` from a dict or a ``ModelOutput``, else the first element of a tuple).

Checkpoints: after the ``Trainer`` saves ``checkpoint-<step>``, the callback writes the fingerprint of every tensor
of the model's state into it (``sdcguard.json``) and tells the guard (an incident names the newest verified
checkpoint to restart from); when training resumes from such a folder, the loaded model is checked against it before
the first step (``CheckpointCorrupted`` names the key).
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from ..checkpoint.record import corrupted, differences, fingerprints, make_record, read_record, write_record
from ..training.config import StepReport
from ..training.guard import SDCGuard

RECORD = "sdcguard.json"

__all__ = ["SDCGuardTrainerCallback", "model_output_loss", "output_loss"]


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss in a model's output, read the way the ``Trainer`` reads it: ``output["loss"]`` from a dict (a
    ``ModelOutput`` is one), else the first element of a tuple or list; ``None`` when there is none."""
    if isinstance(output, dict):
        loss = output.get("loss")
    elif isinstance(output, tuple | list) and output:
        loss = output[0]
    else:
        loss = getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def model_output_loss(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The replay's loss: the model's own ``loss`` output for the recorded keyword inputs (see :func:`output_loss`)."""
    loss = output_loss(model(**batch))
    if loss is None:
        raise TypeError("SDCGuardTrainerCallback: the model returned no loss for a replay (pass labels)")
    return loss


class SDCGuardTrainerCallback(TrainerCallback):
    """Runs :class:`SDCGuard` on a Hugging Face ``Trainer`` (keyword arguments go to ``SDCGuard``)."""

    def __init__(self, **guard_kwargs: Any) -> None:
        self.guard_kwargs = guard_kwargs
        self.guard: SDCGuard | None = None
        self.last_report: StepReport | None = None
        self._hooks: list[Any] = []
        self._micro_batches = 1
        self._step = 0
        self._warned = False

    def _training(self, module: Any) -> bool:
        guard = self.guard
        return guard is not None and not guard.replaying and module.training and torch.is_grad_enabled()

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._training(module):
            return
        assert self.guard is not None
        if args:  # a positional call (a custom compute_loss): name the arguments, so model(**batch) replays it
            kwargs = dict(inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments)
        if not self.guard.observing:
            self.guard.begin_step(self._step, micro_batches=self._micro_batches)
        self.guard.before_forward(dict(kwargs))

    def _post(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self._training(module):
            return
        assert self.guard is not None
        loss = output_loss(output)
        if loss is not None:
            self.guard.observe_loss(loss)
        elif not self._warned:
            self._warned = True
            warnings.warn(
                "SDCGuardTrainerCallback: the model returned no loss (pass labels), so its replays start "
                "from a gradient of one: with gradient accumulation or a loss scaler they will disagree",
                RuntimeWarning,
                stacklevel=2,
            )

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.guard is None:
            # The unwrapped model: the framework's DDP (or FSDP2) around it does the reduction; the guard's hooks on
            # its parameters see the gradients of that backward.
            self.guard = SDCGuard(model, model_output_loss, **self.guard_kwargs)
            self._hooks = [
                model.register_forward_pre_hook(self._pre, with_kwargs=True),
                model.register_forward_hook(self._post, with_kwargs=True),
            ]
        self._micro_batches = max(1, int(args.gradient_accumulation_steps))
        if state.global_step > 0 and model is not None:  # resuming: check what the Trainer loaded
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                body = read_record(folder / RECORD, str(folder), strict=False)
                if body is not None:
                    differing, _ = differences(body, fingerprints(model.state_dict()))
                    if differing:
                        raise corrupted(f"checkpoint {folder}", {k: [0] for k in differing})

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.guard is None or model is None:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        step = state.global_step - 1
        last = self.guard.last_verified_step
        body = make_record([fingerprints(model.state_dict())], step=step, verified=last is not None and step <= last)
        if state.is_world_process_zero and folder.is_dir():
            write_record(folder / RECORD, body)
        self.guard.record_checkpoint(str(folder), step, body["digest"])

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step = state.global_step

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is None:
            return
        if not self.guard.observing:
            # Never silently unchecked: the Trainer ran no training forward of the model the guard watches.
            warnings.warn(
                "SDCGuardTrainerCallback saw no training forward of the model before an optimizer "
                "step: that step is not checked",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self.last_report = self.guard.end_step()  # a vetoed step's gradients are already dropped

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.after_optimizer_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.close()
        for h in self._hooks:
            h.remove()
        self._hooks = []
