"""Lightning adapter: :class:`SDCGuardCallback` watches every optimizer step of a ``Trainer`` with the guard.

The guard observes the step Lightning runs (DDP, or FSDP2 through ``ModelParallelStrategy``): its hooks fingerprint
the local gradients of the sampled micro-batch in Lightning's own backward, and the reduced gradients just before
the optimizer step. The callback tells the guard where the step's pieces are: it wraps the module's
``training_step`` for the run (the micro-batch and ``batch_idx`` go in, the loss Lightning backpropagates comes out,
so the replay reproduces the gradient that flowed into it: ``1/accumulate_grad_batches``, times a ``GradScaler``'s
scale), ends the step in ``on_before_optimizer_step`` (gradients accumulated, unscaled, not yet clipped) and
compares the weights after it. A vetoed step has its gradients dropped, so the optimizer step changes nothing::

    guard_cb = SDCGuardCallback(replay_every=50, store="fleet.db")
    trainer = L.Trainer(strategy="ddp", callbacks=[guard_cb])
    guard_cb.guard.incidents   # after (or during) fit

A replay calls the original ``training_step`` with ``self.log`` silenced, so replays never reach the logs.

Checkpoints: :class:`SDCGuardCheckpointIO` writes Lightning's own checkpoint files with a record of every tensor's
fingerprint beside each (``<file>.sdcguard.json``) and checks it when Lightning reads the file back
(``CheckpointCorrupted`` names the key); ``Trainer(plugins=[SDCGuardCheckpointIO(guard_cb)], callbacks=[guard_cb])``.
The callback tells the guard about every checkpoint (as ``step=<global_step>``, Lightning's own naming), so an
incident names the newest verified one to restart from.

Lightning's ``ModelParallelStrategy`` (FSDP2, tensor parallel) saves its distributed checkpoints through DCP inside
the strategy, not through a ``CheckpointIO``: :class:`SDCGuardModelParallelStrategy` is that strategy with those
saves made asynchronous and verified (:class:`~sdcguard.checkpoint.asynchronous.AsyncCheckpointer`: the loop
waits for the copy to host memory only; the record lands in the checkpoint directory; the checkpoint is named to
the guard by its path once every rank's write finished)::

    guard_cb = SDCGuardCallback(replay_every=50)
    L.Trainer(strategy=SDCGuardModelParallelStrategy(guard_cb), callbacks=[guard_cb, ModelCheckpoint(...)])
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from lightning.pytorch.strategies import ModelParallelStrategy
except ImportError:  # the older package name (mypy sees both packages' classes as distinct types)
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    from pytorch_lightning.plugins.io import TorchCheckpointIO  # type: ignore[assignment]
    from pytorch_lightning.strategies import ModelParallelStrategy  # type: ignore[assignment]

from ..checkpoint.asynchronous import AsyncCheckpointer, Writer
from ..checkpoint.record import corrupted, differences, fingerprints, make_record, read_record, write_record
from ..training.config import StepReport
from ..training.guard import SDCGuard

__all__ = ["SDCGuardCallback", "SDCGuardCheckpointIO", "SDCGuardModelParallelStrategy", "training_step_loss"]

_LIGHTNING_META = "meta.pt"
"""The file Lightning writes beside DCP's in a distributed checkpoint (the trainer's state but the tensors)."""


def _loss_of(out: Any) -> torch.Tensor:
    return out["loss"] if isinstance(out, dict) else out


def training_step_loss(module: Any, batch: Any) -> torch.Tensor:
    """The default loss: the LightningModule's own ``training_step`` (``batch`` is ``(batch, batch_idx)``)."""
    data, idx = batch
    return _loss_of(module.training_step(data, idx))


@contextlib.contextmanager
def _logging_silenced(module: Any) -> Iterator[None]:
    module.log = module.log_dict = lambda *a, **k: None
    try:
        yield
    finally:
        del module.log, module.log_dict


class SDCGuardCallback(Callback):
    """Runs :class:`SDCGuard` on a Lightning ``Trainer`` (keyword arguments go to ``SDCGuard``)."""

    def __init__(self, **guard_kwargs: Any) -> None:
        self.guard_kwargs = guard_kwargs
        self.guard: SDCGuard | None = None
        self.last_report: StepReport | None = None
        self._state: dict[str, Any] | None = None
        self._module: Any = None
        self._original: Any = None
        self._trainer: Any = None
        self._stepped = False

    def _replay_loss(self, module: Any, batch: Any) -> torch.Tensor:
        data, idx = batch
        with _logging_silenced(self._module):
            return _loss_of(self._original(data, idx))

    def _training_step(self, batch: Any, batch_idx: int, *args: Any, **kwargs: Any) -> Any:
        guard = self.guard
        if guard is None or guard.replaying:
            return self._original(batch, batch_idx, *args, **kwargs)
        if not guard.observing:
            guard.begin_step(self._trainer.global_step, micro_batches=self._trainer.accumulate_grad_batches)
        guard.before_forward((batch, batch_idx))
        out = self._original(batch, batch_idx, *args, **kwargs)
        loss = _loss_of(out) if out is not None else None
        if isinstance(loss, torch.Tensor):
            guard.observe_loss(loss)
        return out

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # After the strategy wrapped the model (DDP) or sharded it (FSDP2): the guard watches that model.
        if self.guard is None:
            self.guard = SDCGuard(trainer.strategy.model, self._replay_loss, **self.guard_kwargs)
            if self._state:
                self.guard.load_state_dict(self._state)
        self._trainer, self._module = trainer, pl_module
        self._original = pl_module.training_step
        pl_module.training_step = self._training_step

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.guard is not None and self.guard.observing:
            self.last_report = self.guard.end_step()  # a vetoed step's gradients are already dropped
            self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.guard is not None and self._stepped:
            self._stepped = False
            self.guard.after_optimizer_step()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Every rank (Lightning writes the file on the first rank only): the guard remembers it alike everywhere.
        # An asynchronous save names itself to the guard once it is written (SDCGuardModelParallelStrategy).
        if isinstance(trainer.strategy, SDCGuardModelParallelStrategy):
            return
        if self.guard is not None and trainer.global_step > 0:
            self.guard.record_checkpoint(f"step={trainer.global_step}", trainer.global_step - 1)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.guard is not None:
            self.guard.close()
        if self._original is not None and "training_step" in vars(pl_module):
            del pl_module.training_step

    def state_dict(self) -> dict[str, Any]:
        return self.guard.state_dict() if self.guard is not None else (self._state or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._state = dict(state_dict) or None
        if self.guard is not None and self._state:
            self.guard.load_state_dict(self._state)


class SDCGuardCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint files, with the fingerprint of every tensor recorded beside each and checked on load.

    ``callback``: the run's :class:`SDCGuardCallback`, so the record says whether the guard's checks vouch for the
    saved state. ``strict=True`` refuses a checkpoint without a record (a warning otherwise).
    """

    def __init__(self, callback: SDCGuardCallback | None = None, *, strict: bool = False) -> None:
        super().__init__()
        self.callback = callback
        self.strict = strict

    @staticmethod
    def record_path(path: Any) -> Path:
        return Path(f"{path}.sdcguard.json")

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        fps = fingerprints(checkpoint)  # before the file is written: what the trainer holds
        super().save_checkpoint(checkpoint, path, storage_options)
        guard = self.callback.guard if self.callback is not None else None
        step = int(checkpoint.get("global_step", 0)) - 1
        verified = None
        if guard is not None:
            last = guard.last_verified_step
            verified = last is not None and step <= last
        write_record(self.record_path(path), make_record([fps], step=step, verified=verified))

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        body = read_record(self.record_path(path), str(path), strict=self.strict)
        kwargs: dict[str, Any] = {"weights_only": weights_only}
        if map_location is not None:
            kwargs["map_location"] = map_location
        checkpoint = super().load_checkpoint(path, **kwargs)
        if body is not None:
            differing, _ = differences(body, fingerprints(checkpoint))
            if differing:
                raise corrupted(f"checkpoint {path}", {k: [0] for k in differing})
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        self.record_path(path).unlink(missing_ok=True)


class SDCGuardModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` whose distributed checkpoints are asynchronous verified saves.

    ``callback``: the run's :class:`SDCGuardCallback` (its guard decides whether a checkpoint is verified);
    ``writer``: ``"thread"`` or ``"process"`` (DCP's checkpoint process). Other keyword arguments go to
    ``ModelParallelStrategy``. A save settles at the next one, before Lightning removes a checkpoint, and at the end
    of fitting; ``checkpointer.settled`` lists the outcomes.
    """

    def __init__(self, callback: SDCGuardCallback | None = None, *, writer: Writer = "thread", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.callback = callback
        self.checkpointer = AsyncCheckpointer(writer=writer)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if not self._save_distributed_checkpoint or storage_options is not None:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(filepath))
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        guard = self.callback.guard if self.callback is not None else None
        step = int(checkpoint.get("global_step", 0)) - 1
        self.checkpointer.save(state, checkpoint_id=path, guard=guard, step=step if step >= 0 else None, overwrite=True)
        if self.global_rank == 0:
            torch.save(checkpoint, path / _LIGHTNING_META)

    def remove_checkpoint(self, filepath: Any) -> None:
        self.checkpointer.wait()  # never delete a checkpoint under a write in flight
        super().remove_checkpoint(filepath)

    def teardown(self) -> None:
        self.checkpointer.close()
        super().teardown()
