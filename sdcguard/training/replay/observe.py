"""Watching one training step as the framework runs it: which micro-batch is sampled, its capture, its seed and the
fingerprints of its local gradients.

The entry points (``guard.step``, the Lightning and Hugging Face callbacks, a raw FSDP2 loop) differ only in who
calls these methods: :meth:`StepObserver.begin` at the start of an optimizer step, :meth:`before_forward` before
each micro-batch's forward (the batch, the random states; on the sampled micro-batch the hooks are armed and the
autocast state is read inside the forward), :meth:`observe_loss` with the loss tensor that the backward starts from
(a hook on it reads the seed: the gradient that flows into the loss), and :meth:`finish` before the optimizer step.

What the sample is compared on (:data:`~sdcguard.training.digest.Basis`) is settled in :meth:`finish`: the local
gradients as the framework handed them over, when the sampled micro-batch's were handed over on their own; else,
where the hooks can see them (FSDP2), each parameter's gradient as autograd produced it for that micro-batch (the
micro-batches were accumulated without gradient sync, or a shard group of one rank reduced without a
reduce-scatter); else the sample is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...fingerprints import local_tensor
from ..digest import Basis, LocalRecord
from ..hooks.taps import Taps
from .capture import AutocastProbe, Batch, Capture, RngHook, capture_rng, make_capture
from .collectives import CollectiveTracer

__all__ = ["StepObserver", "Observed"]


@dataclass
class Observed:
    """What one step's observation produced for the sampled round."""

    capture: Capture
    record: LocalRecord
    valid: bool = True
    """False when the original's local gradients were not seen on their own on any basis (none handed over for the
    sampled micro-batch, or a micro-batch of the step accumulated without reduction, and the hooks cannot see the
    gradients as produced): the sample cannot be judged."""


class StepObserver:
    """Per-step observation state of one rank (see the module docstring)."""

    def __init__(
        self,
        taps: Taps,
        *,
        rank: int,
        device: torch.device,
        rng_hook: RngHook | None,
        tracer: CollectiveTracer | None = None,
    ) -> None:
        self.taps = taps
        self.tracer = tracer
        """Traces the sampled micro-batch's contributions to its unit's collectives (None outside a unit)."""
        self.rank = rank
        self.device = device
        self.rng_hook = rng_hook
        self.step: int | None = None
        self._record_here = False
        self._chosen = 0
        self._index = 0
        self._capture: Capture | None = None
        self._record: LocalRecord | None = None
        self._probe: AutocastProbe | None = None
        self._seed: list[torch.Tensor] = []
        self._armed = False
        self.nonfinite_losses: torch.Tensor | None = None
        """``(losses not finite, backwards seeded above 1)`` this step, int64 on the device, counted without a sync:
        a seed above 1 is a loss scaler at work (a ``GradScaler``), whose overflowing steps it skips itself."""

    @property
    def active(self) -> bool:
        """Between :meth:`begin` and :meth:`finish`."""
        return self.step is not None

    def begin(self, step: int, *, record: bool, chosen: int = 0) -> None:
        """Start observing step ``step``; ``record``: this rank captures micro-batch ``chosen`` of it."""
        self.step, self._record_here, self._chosen, self._index = step, record, chosen, 0
        self._capture, self._record, self._seed, self._probe = None, None, [], None
        self._count, self._silent = self.taps.handed_over, False
        self.nonfinite_losses = None

    def before_forward(self, batch: Batch) -> None:
        """Call right before a micro-batch's forward (in order; the first one is micro-batch 0)."""
        if self.step is None:
            raise RuntimeError("before_forward() outside a step: call begin_step() first")
        self._disarm()
        self._tally()
        if self._record_here and self._index == self._chosen:
            self._capture = make_capture(
                step=self.step, rank=self.rank, micro_batch=self._index, batch=batch, rng=capture_rng(self.rng_hook)
            )
            bases: tuple[Basis, ...] = ("handed_over", "produced") if self.taps.produces else ("handed_over",)
            self._record = LocalRecord(len(self.taps.unit_names), self.device, bases=bases)
            self._probe = AutocastProbe()
            self.taps.arm(self._record)
            self._armed = True
            if self.tracer is not None:  # until the next micro-batch's forward, or finish(): its backward included
                self.tracer.start(self._record)
        self._index += 1

    def observe_loss(self, loss: torch.Tensor) -> None:
        """The loss tensor a micro-batch's backward starts from (every one counted when not finite; the sampled one's
        fingerprinted, its seed observed)."""
        bad = (~torch.isfinite(local_tensor(loss).detach())).any().to(torch.int64)
        self._count_losses(torch.stack([bad, torch.zeros_like(bad)]))
        if loss.requires_grad and loss.numel() == 1:  # its seed: above 1 where a loss scaler multiplied the loss
            loss.register_hook(lambda g: self._count_losses(_seeded(g)))
        if not self._armed or self._record is None:
            return
        self.taps.arm(self._record)  # again, now that the forward ran (FSDP2 made its unsharded parameters in it)
        self._record.set_loss(loss)
        if loss.requires_grad:
            # kept on its device during the backward (no host sync there); moved to the host in finish()
            # (a DTensor loss, under loss_parallel: its local value; the replay puts the placement back)
            loss.register_hook(lambda g: self._seed.append(local_tensor(g).detach().clone()))

    def finish(self) -> Observed | None:
        """End the step's observation; the sampled micro-batch's capture and record (None when not recorded here)."""
        self._disarm()
        self._tally()
        self.step = None
        if self._capture is None or self._record is None:
            return None
        autocast = self._probe.state if self._probe is not None else None
        seed = self._seed[-1].to("cpu") if self._seed else None
        record = self._record
        handed = record.saw("handed_over") and not self._silent
        if not handed and record.saw("produced"):  # accumulated before it was handed over: its own gradient
            record.select("produced")
        cap = replace(self._capture, autocast=autocast, seed=seed, basis=record.basis)
        out = Observed(capture=cap, record=record, valid=handed or record.basis == "produced")
        self._capture, self._record = None, None
        return out

    def _count_losses(self, counts: torch.Tensor) -> None:
        self.nonfinite_losses = counts if self.nonfinite_losses is None else self.nonfinite_losses + counts

    def _tally(self) -> None:
        """After a micro-batch's backward: did it hand any local gradient over?"""
        if self._index > 0 and self.taps.handed_over == self._count:
            self._silent = True
        self._count = self.taps.handed_over

    def _disarm(self) -> None:
        if self.tracer is not None:
            self.tracer.stop()
        if self._armed:
            self.taps.arm(None)
            self._armed = False
        if self._probe is not None:
            self._probe.remove()


def _seeded(seed: torch.Tensor) -> torch.Tensor:
    """``(0, whether a scalar loss's backward seed is above 1 in magnitude)``, int64 on its device."""
    scaled = (local_tensor(seed).detach().abs() > 1).any().to(torch.int64)
    return torch.stack([torch.zeros_like(scaled), scaled])
