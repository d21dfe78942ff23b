"""Deterministic replay: recompute a micro-batch's loss and *local* gradients and compare them bit for bit.

The guard computes every local gradient itself, with ``torch.autograd.grad`` over the parameters (see
:mod:`sdcguard.guard` for why), and a replay runs exactly the same code: same module, same parameter values, same
batch, same random states. The result goes into fresh tensors: the live ``.grad`` and the optimizer state are
never touched, module buffers (running statistics) are put back afterwards, and the training run's random stream
is restored. What is compared is a :class:`Digest`: the exact fingerprint of the loss and of every parameter's
local gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .capture import Batch, Capture, RngHook, batch_for_replay, rng_replayed
from .fingerprint import fingerprint_many

__all__ = ["LossFn", "Digest", "Mismatch", "local_gradients", "digest", "replay", "first_mismatch"]

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
"""``loss_fn(model, batch) -> scalar loss``; the guard calls it for the step and for every replay."""


@dataclass(frozen=True)
class Digest:
    """Exact fingerprints of one computation: the loss and each parameter's local gradient (parameter order)."""

    loss: int
    grads: tuple[int, ...]


@dataclass(frozen=True)
class Mismatch:
    """Where two digests of the same micro-batch first differ."""

    index: int | None
    """Index of the first differing parameter gradient; None when only the loss differs."""
    loss_differs: bool


def local_gradients(
    module: nn.Module,
    loss_fn: LossFn,
    params: Sequence[nn.Parameter],
    batch: Batch,
    loss_scale: float = 1.0,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward and backward of one micro-batch into new tensors: ``(loss, grads)``, one grad per parameter.

    ``loss_scale`` multiplies the loss before the backward pass (``1/k`` for ``k`` accumulated micro-batches); the
    returned loss is the unscaled one. A parameter the loss does not reach gets a zero gradient.
    """
    with torch.enable_grad():
        loss = loss_fn(module, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("loss_fn(model, batch) must return a scalar tensor")
        scaled = loss * loss_scale if loss_scale != 1.0 else loss
        grads = torch.autograd.grad(scaled, list(params), allow_unused=True)
    out = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
    return loss.detach(), out


def digest(loss: torch.Tensor, grads: Sequence[torch.Tensor]) -> Digest:
    """Fingerprint a computation's loss and gradients with one host synchronisation."""
    fps = fingerprint_many([loss, *grads])
    return Digest(loss=int(fps[0]), grads=tuple(int(f) for f in fps[1:]))


def first_mismatch(a: Digest, b: Digest) -> Mismatch | None:
    """None when the two digests are identical, else where they first differ."""
    if a == b:
        return None
    index = next((i for i, (x, y) in enumerate(zip(a.grads, b.grads)) if x != y), None)
    if index is None and len(a.grads) != len(b.grads):
        index = min(len(a.grads), len(b.grads))
    return Mismatch(index=index, loss_differs=a.loss != b.loss)


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
def _parameters_swapped(params: Sequence[nn.Parameter], values: Sequence[torch.Tensor] | None) -> Iterator[None]:
    # Swapping .data (not copying) lets autograd.grad differentiate with respect to the same Parameter objects
    # at the captured values, at the cost of no extra memory; the live values are put back afterwards.
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


def replay(
    module: nn.Module,
    loss_fn: LossFn,
    params: Sequence[nn.Parameter],
    capture: Capture,
    *,
    device: torch.device,
    rng_hook: RngHook | None = None,
    same_process: bool = False,
    param_values: Sequence[torch.Tensor] | None = None,
) -> Digest:
    """Recompute the captured micro-batch on this process and return its :class:`Digest`.

    ``param_values`` replays at other parameter values than the live ones (a shadow rank, or a re-run after the
    optimizer moved on); ``same_process`` says the capture was taken by this very process (all CUDA generator
    states are then restored, not only the current device's).
    """
    batch = batch_for_replay(capture, device)
    with _buffers_kept(module), _parameters_swapped(params, param_values):
        with rng_replayed(capture.rng, rng_hook, same_process=same_process):
            loss, grads = local_gradients(module, loss_fn, params, batch, capture.loss_scale)
        return digest(loss, grads)
