"""The guard's hooks for a model trained with DDP (or in one process): one tensor hook per parameter.

Autograd hands each parameter's local gradient to a hook registered on the parameter before it is accumulated into
``.grad`` and before DDP copies it into a bucket and all-reduces it, so the hook sees exactly the gradient of the
framework's own backward, micro-batch by micro-batch (also under ``no_sync`` accumulation, where DDP's buckets
only ever see the sum). On a sampled micro-batch the hook fingerprints it on the device and returns nothing, so
the framework's computation, its bucketing and its overlap of communication with the backward stay exactly as they
are. On every step of a DDP model the same hook also says what DDP should reduce for the parameter, and the guard's
DDP comm hook checks the bucket against it before the all-reduce (:mod:`.bucket`: the gradient's path from this hook
into the reduction).

A replay runs ``torch.autograd.grad`` through the module without its DDP wrapper (no reducer, no ``.grad``), and the
same hooks fingerprint each gradient as it is produced and hand autograd an expanded zero in its place, so the
replay's gradient is freed at once: a replay holds its activations, never a copy of the gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeGuard

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...errors import BadInput
from ...fingerprints import is_dtensor_type
from ..digest import LocalRecord
from .bucket import ReductionWatch

__all__ = ["ParamTaps", "unwrap", "wrap_ddp", "is_ddp"]


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` wrapper (the model itself otherwise)."""
    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def wrap_ddp(module: nn.Module, group: object = None, taps: object = None) -> DistributedDataParallel:
    """DDP around a plain module of a distributed job, on its own device: the framework's reduction, overlapped
    with the backward, for loops that hand the guard an unwrapped model; ``taps`` (a :class:`ParamTaps`) watch its
    reduction (:mod:`.bucket`). DDP cannot wrap ``DTensor`` parameters (an expert-parallel model's experts): refused
    in one line."""
    if any(is_dtensor_type(type(p)) for p in module.parameters()):
        raise BadInput(
            "guard.step wraps the model in DDP, which cannot hold DTensor parameters: an expert- or tensor-parallel "
            "job reduces its own gradients (or with FSDP2) and makes the guard's four calls (begin_step, "
            "before_forward, observe_loss, end_step) around its forward and backward"
        )
    device = next(module.parameters()).device
    ids = [device] if device.type == "cuda" else None
    ddp = DistributedDataParallel(module, device_ids=ids, process_group=group)
    if isinstance(taps, ParamTaps):
        taps.reduction.watch(ddp)
    return ddp


class ParamTaps:
    """Tensor hooks on every trainable parameter (see the module docstring)."""

    collective_replay = False
    produces = False  # the gradient autograd hands the tensor hook is the one DDP's reducer takes

    def __init__(
        self,
        module: nn.Module,
        named: Sequence[tuple[str, nn.Parameter]],
        *,
        replay_module: nn.Module | None = None,
        replay_context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.replay_module = module if replay_module is None else replay_module
        self.replay_context = replay_context
        self.unit_names = [n for n, _ in named]
        self.param_names = self.unit_names
        self.params = [p for _, p in named]
        self.device = self.params[0].device
        self._record: LocalRecord | None = None
        self._replaying = False
        self.handed_over = 0
        self.reduction = ReductionWatch(self.params, self.device)
        """The gradients' path into DDP's reduction, on every step of a DDP model it watches (:mod:`.bucket`)."""
        self._handles = [p.register_hook(partial(self._hook, i)) for i, p in enumerate(self.params)]

    def _hook(self, index: int, grad: torch.Tensor) -> torch.Tensor | None:
        record = self._record
        if record is not None:
            record.add(index, grad)
        if self._replaying:  # free the replay's gradient now: autograd keeps a zero-strided view of one element
            return torch.zeros((), dtype=grad.dtype, device=grad.device).expand_as(grad)
        self.handed_over += 1
        self.reduction.expect(index, grad)
        return None

    def arm(self, record: LocalRecord | None) -> None:
        self._record = record

    def replay_backward(self, loss: torch.Tensor, seed: torch.Tensor | None, record: LocalRecord) -> None:
        self._record, self._replaying = record, True
        try:
            torch.autograd.grad(loss, self.params, grad_outputs=seed, allow_unused=True)
        finally:
            self._record, self._replaying = None, False

    def reduced(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self.params]

    def weights(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.params]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def is_ddp(model: nn.Module) -> TypeGuard[DistributedDataParallel]:
    """Whether ``model`` is wrapped in DDP."""
    return isinstance(model, DistributedDataParallel)


def release_ddp(model: DistributedDataParallel) -> None:
    """Take a DDP wrapper's autograd hooks off its parameters, so a backward through a new wrapper of the same module
    (after a recovery re-formed the group) is not also reduced over the old group, whose ranks may be gone. Its
    reducer would remove them when it is freed, but the loop may still hold the old wrapper."""
    reducer = getattr(model, "reducer", None)
    if reducer is not None:
        reducer._remove_autograd_hooks()  # torch's own teardown of the hooks, named for compiled autograd
