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

__all__ = [
    "LossFn",
    "Digest",
    "Mismatch",
    "BUCKET_BYTES",
    "local_gradients",
    "digest",
    "param_fingerprints",
    "replay",
    "first_mismatch",
]

LossFn = Callable[[nn.Module, Batch], torch.Tensor]
"""``loss_fn(model, batch) -> scalar loss``; the guard calls it for the step and for every replay."""


@dataclass(frozen=True, eq=False)
class Digest:
    """Exact fingerprints of one computation: the loss and the local gradients.

    ``buckets`` fingerprints the gradients concatenated in parameter order (one flat tensor per run of equal
    dtype, at most :data:`BUCKET_BYTES` each): one fingerprint per bucket instead of one per parameter keeps the
    cost at memory speed for models with hundreds of small tensors, and a single flipped bit anywhere still
    changes it. ``params`` (per-parameter fingerprints) is filled when asked for, to name the first differing
    parameter. Two digests are equal when loss and buckets are.
    """

    loss: int
    buckets: tuple[int, ...]
    params: tuple[int, ...] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Digest):
            return NotImplemented
        return self.loss == other.loss and self.buckets == other.buckets

    def __hash__(self) -> int:
        return hash((self.loss, self.buckets))


BUCKET_BYTES = 64 * 1024 * 1024
"""Largest flat gradient bucket fingerprinted at once (bounds the temporary copy)."""


@dataclass(frozen=True)
class Mismatch:
    """Where two digests of the same micro-batch first differ."""

    index: int | None
    """Index of the first differing parameter gradient; None when only the loss differs or it is not known
    (a digest without per-parameter fingerprints)."""
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


def _buckets(grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if out and (g.dtype != out[-1][0].dtype or g.device != out[-1][0].device or size + nbytes > BUCKET_BYTES):
            out.append([])
            size = 0
        if not out:
            out.append([])
        out[-1].append(g)
        size += nbytes
    return out


def param_fingerprints(grads: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """Per-parameter fingerprints (one host synchronisation)."""
    return tuple(int(f) for f in fingerprint_many(list(grads)))


def digest(loss: torch.Tensor, grads: Sequence[torch.Tensor], *, per_param: bool = False) -> Digest:
    """Fingerprint a computation's loss and gradients (one host synchronisation per bucket group)."""
    loss_fp = int(fingerprint_many([loss])[0])
    bucket_fps: list[int] = []
    for bucket in _buckets(grads):
        flat = torch.cat([g.reshape(-1) for g in bucket]) if len(bucket) > 1 else bucket[0]
        bucket_fps.append(int(fingerprint_many([flat])[0]))
        del flat  # one temporary bucket at a time
    return Digest(loss=loss_fp, buckets=tuple(bucket_fps), params=param_fingerprints(grads) if per_param else None)


def first_mismatch(a: Digest, b: Digest) -> Mismatch | None:
    """None when the two digests are identical, else where they first differ (as far as the digests tell)."""
    if a == b:
        return None
    index = None
    if a.buckets != b.buckets and a.params is not None and b.params is not None:
        index = next((i for i, (x, y) in enumerate(zip(a.params, b.params)) if x != y), None)
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
    per_param: bool = False,
    keep: list[torch.Tensor] | None = None,
) -> Digest:
    """Recompute the captured micro-batch on this process and return its :class:`Digest`.

    ``param_values`` replays at other parameter values than the live ones (a shadow rank, or a re-run after the
    optimizer moved on); ``same_process`` says the capture was taken by this very process (all CUDA generator
    states are then restored, not only the current device's). ``per_param`` adds per-parameter fingerprints;
    a ``keep`` list receives the replay's gradients (to fingerprint per parameter later, on a mismatch).
    """
    batch = batch_for_replay(capture, device)
    with _buffers_kept(module), _parameters_swapped(params, param_values):
        with rng_replayed(capture.rng, rng_hook, same_process=same_process):
            loss, grads = local_gradients(module, loss_fn, params, batch, capture.loss_scale)
        if keep is not None:
            keep.extend(grads)
        return digest(loss, grads, per_param=per_param)
