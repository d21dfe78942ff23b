"""Deterministic replay: recompute one captured micro-batch and fingerprint its loss and local gradients.

A replay runs ``loss_fn`` on the parallelism's replay module (the model without its DDP wrapper, or the FSDP2
module itself) with the captured batch, random states and autocast state, then the parallelism's replay backward
with the captured seed. The same hooks that fingerprint the original fingerprint the replay, unit by unit, as its
backward produces the gradients, and free each at once; nothing reaches ``.grad``, the optimizer state or the
gradient communication. Module buffers (running statistics) are put back afterwards and the training run's random
stream is restored, so a replay changes nothing the training step computes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from ...fingerprints import is_dtensor_type, local_tensor
from ..digest import Digest, LocalRecord
from ..hooks.taps import Taps
from .capture import Batch, Capture, RngHook, autocast_replayed, batch_for_replay, rng_replayed
from .collectives import CollectiveTracer

__all__ = ["LossFn", "replay", "check_loss", "parameters_swapped", "Replayer"]

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
"""``loss_fn(model, batch) -> scalar loss``; the guard calls it for the step and for every replay."""


def check_loss(loss: object, *, scalar: bool = True) -> torch.Tensor:
    """``loss`` if it is a scalar tensor (any tensor with ``scalar=False``: a pipeline stage's output, whose backward
    starts from its captured gradient), else a clear error (a user's ``loss_fn`` returned something else)."""
    if isinstance(loss, torch.Tensor) and not scalar:
        return loss
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(
            f"loss_fn(model, batch) must return a scalar tensor, got {type(loss).__name__}"
            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
        )
    return loss


@contextlib.contextmanager
def _buffers_kept(module: nn.Module) -> Iterator[None]:
    # A replay must not advance running statistics (BatchNorm) or any other buffer the forward updates.
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


@contextlib.contextmanager
def parameters_swapped(params: Sequence[nn.Parameter], values: Sequence[torch.Tensor] | None) -> Iterator[None]:
    """Run the body with ``params`` holding ``values`` (``.data`` swapped, no copy), then put the live values back."""
    if values is None:
        yield
        return
    if len(values) != len(params):
        raise ValueError(f"replay got {len(values)} parameter values for {len(params)} parameters")
    live = [p.data for p in params]
    try:
        for p, v in zip(params, values):
            p.data = v.to(device=p.device, dtype=p.dtype)
        yield
    finally:
        for p, v in zip(params, live):
            p.data = v


def _seed_for(loss: torch.Tensor, seed: torch.Tensor | None) -> torch.Tensor | None:
    """The captured gradient of the loss, on the loss's device and dtype (a DTensor loss: with its placement)."""
    if seed is None:
        return None
    value = seed.to(device=local_tensor(loss).device, dtype=loss.dtype)
    if is_dtensor_type(type(loss)):
        from torch.distributed.tensor import DTensor

        assert isinstance(loss, DTensor)
        return DTensor.from_local(value, loss.device_mesh, loss.placements, run_check=False)
    return value


def replay(
    taps: Taps,
    loss_fn: LossFn,
    capture: Capture,
    *,
    device: torch.device,
    rng_hook: RngHook | None = None,
    same_process: bool = False,
    params: Sequence[nn.Parameter] = (),
    param_values: Sequence[torch.Tensor] | None = None,
    tracer: CollectiveTracer | None = None,
) -> Digest:
    """Recompute the captured micro-batch on this process and return its :class:`Digest`.

    ``param_values`` replays at other parameter values than the live ones (``params`` holds the parameters they
    stand for); ``tracer`` traces the replay's contributions to its unit's collectives; ``same_process`` says the
    capture was taken by this very process (all CUDA generator states are then restored, not only the current
    device's).
    """
    batch = batch_for_replay(capture, device)
    record = LocalRecord(len(taps.unit_names), device, bases=(capture.basis,))
    module = taps.replay_module
    traced = tracer.tracing(record) if tracer is not None else contextlib.nullcontext()
    with _buffers_kept(module), parameters_swapped(params, param_values), torch.enable_grad(), taps.replay_context():
        with rng_replayed(capture.rng, rng_hook, same_process=same_process), traced:
            with autocast_replayed(capture.autocast):
                loss = check_loss(loss_fn(module, batch), scalar=capture.seed is None)
            record.set_loss(loss)
            taps.replay_backward(loss, _seed_for(loss, capture.seed), record)
    return record.digest()


class Replayer:
    """This rank's replays, as the rounds and the calibration ask for them: ``replayer(capture, same_process)`` (at
    the live parameters) or ``replayer(capture, same_process, values)`` (at other values of the same parameters).

    ``timed`` wraps each replay (the guard's clock times replays apart from the step), ``context`` too (the training
    step's own context: torchtitan's ``train_context``, ``loss_parallel``); :attr:`replaying` is True
    while one runs, so a framework hook that sees a forward then knows it is the guard's own."""

    def __init__(
        self,
        taps: Taps,
        loss_fn: LossFn,
        *,
        rng_hook: RngHook | None = None,
        timed: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
        context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
        tracer: CollectiveTracer | None = None,
    ) -> None:
        self.taps = taps
        self.tracer = tracer
        """Traces each replay's contributions to this rank's unit's collectives (None outside a unit)."""
        self.loss_fn = loss_fn
        self.params = list(taps.params)
        """The parameters whose gradients a replay computes (the taps'), on the device it runs on."""
        self.device = self.params[0].device
        self.rng_hook = rng_hook
        self.timed = timed
        self.context = context
        """The context the training step runs in (``loss_parallel``): a replay's forward and backward run in it."""
        self.replaying = False

    def __call__(self, capture: Capture, same_process: bool, values: Sequence[torch.Tensor] | None = None) -> Digest:
        self.replaying = True
        try:
            with self.timed(), self.context():
                return replay(
                    self.taps,
                    self.loss_fn,
                    capture,
                    device=self.device,
                    rng_hook=self.rng_hook,
                    same_process=same_process,
                    params=self.params,
                    param_values=values,
                    tracer=self.tracer,
                )
        finally:
            self.replaying = False
