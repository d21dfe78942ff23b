"""The guard's hooks for a model sharded with FSDP2 (``fully_shard``), HSDP included: a custom reduce-scatter.

FSDP2 gathers the parameters of each ``fully_shard`` module for its forward and backward, then hands that module's
local, unsharded gradients to a reduce-scatter, copied into one flat input laid out shard by shard. FSDP2 lets a
user choose that communication (``FSDPModule.set_custom_reduce_scatter``); the guard installs one that fingerprints
the input on its device (on sampled micro-batches) and then reduce-scatters exactly as FSDP2's default does. The
input's layout depends only on the module and the shard-group size, so a replay on any rank of the job produces
the same layout: one unit per ``fully_shard`` module.

A replay must go through the same sharded module (its forward all-gathers the parameters), so every rank replays at
the same time (``collective_replay``): each rank runs a forward and backward of its chosen capture, the
reduce-scatter fingerprints its input and writes zeros instead of communicating, and the sharded ``.grad`` the
replay produces is dropped unit by unit as the next one arrives and put back as it was at the end. Under HSDP the
replicate-dimension all-reduce of those zeros still runs (FSDP2 issues it itself).

Cross-replica checks compare the local shards of the reduced gradients and of the weights between ranks that hold
the same shard (:func:`sdcguard.training.mesh.replica_classes`, from every parameter's placements): under HSDP the
replicate dimension; under plain FSDP every shard exists once, so there is nothing to compare (the replay covers
each rank's computation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from ...fingerprints import local_tensor
from ..digest import LocalRecord

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["FSDPTaps", "is_fsdp"]


def _fsdp_module_type() -> type[FSDPModule] | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return None
    return FSDPModule


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2's ``fully_shard``."""
    kind = _fsdp_module_type()
    return kind is not None and isinstance(model, kind)


def _reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: Any, op: Any, async_op: bool) -> Any:
    # The same call as FSDP2's default reduce-scatter (torch 2.13 renamed reduce_scatter_tensor to _single).
    rs = getattr(dist, "reduce_scatter_single", None)
    if rs is not None:
        return rs(output=output, input=input, group=group, op=op, async_op=async_op)
    return dist.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


_SyncSetting = list[tuple[bool, bool]]


def _sync_setting(module: FSDPModule) -> _SyncSetting | None:
    """The module's gradient-sync setting (``reduce_grads``, ``all_reduce_grads`` of each of its parameter groups):
    FSDP2 offers a setter (``set_requires_gradient_sync``) but no getter, so this reads torch's state, and gives None
    where a torch version keeps it elsewhere."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
        return [(bool(g.reduce_grads), bool(g.all_reduce_grads)) for g in groups]
    except (AttributeError, TypeError):
        return None


def _restore_sync(module: FSDPModule, setting: _SyncSetting | None) -> None:
    if setting is None:  # unknown: leave sync on, the setting FSDP2 starts with
        return
    for g, (reduce, all_reduce) in zip(module._get_fsdp_state()._fsdp_param_groups, setting):
        g.reduce_grads, g.all_reduce_grads = reduce, all_reduce


class _TapReduceScatter:
    """FSDP2's reduce-scatter communication interface (``allocate`` and a call) for one unit."""

    def __init__(self, taps: FSDPTaps, index: int) -> None:
        self.taps = taps
        self.index = index

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any, async_op: bool = False
    ) -> Any:
        return self.taps.reduce_scatter(self.index, output_tensor, input_tensor, group, op, async_op)


class FSDPTaps:
    """Custom reduce-scatters on every ``fully_shard`` module of ``model`` (see the module docstring)."""

    collective_replay = True

    def __init__(self, model: nn.Module, *, replay_module: nn.Module | None = None) -> None:
        assert _fsdp_module_type() is not None
        self.replay_module = model if replay_module is None else replay_module
        self.replay_context = contextlib.nullcontext
        fsdp = [(name, m) for name, m in model.named_modules() if is_fsdp(m)]
        nested: set[int] = set()
        owned: dict[int, list[nn.Parameter]] = {}
        # Innermost first: a module's own parameters are those no nested fully_shard module claimed.
        for k in sorted(range(len(fsdp)), key=lambda k: -fsdp[k][0].count(".") - (fsdp[k][0] != "")):
            m = fsdp[k][1]
            owned[k] = [p for p in m.parameters() if p.requires_grad and id(p) not in nested]
            nested.update(id(p) for p in m.parameters())
        units = [(fsdp[k][0] or "<root>", fsdp[k][1], owned[k]) for k in range(len(fsdp)) if owned[k]]
        self.unit_names = [name for name, _, _ in units]
        self._unit_params = [own for _, _, own in units]
        # fully_shard gives each module a class that subclasses both its own and FSDPModule
        self._modules = [cast("FSDPModule", m) for _, m, _ in units]
        for i, m in enumerate(self._modules):
            # _TapReduceScatter has FSDP2's ReduceScatter interface without subclassing the ABC, which lives in a
            # private torch module that not every torch of the supported range has
            m.set_custom_reduce_scatter(_TapReduceScatter(self, i))  # type: ignore[arg-type]
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._record: LocalRecord | None = None
        self._replaying = False
        self._replayed: list[int] = []
        self.handed_over = 0

    # ------------------------------------------------------------------------------------------- the hook

    def reduce_scatter(
        self, index: int, output: torch.Tensor, input: torch.Tensor, group: Any, op: Any, async_op: bool
    ) -> Any:
        record = self._record
        if record is not None:
            record.add(index, input)
        if not self._replaying:
            self.handed_over += 1
            return _reduce_scatter(output, input, group, op, async_op)
        for j in self._replayed:  # FSDP2 assigned those units' replay shards as .grad after their reduce-scatter
            for p in self._unit_params[j]:
                p.grad = None
        self._replayed.append(index)
        output.zero_()
        return None

    def arm(self, record: LocalRecord | None) -> None:
        self._record = record

    def replay_backward(self, loss: torch.Tensor, seed: torch.Tensor | None, record: LocalRecord) -> None:
        saved = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        sync = [_sync_setting(m) for m in self._modules]
        for m in self._modules:  # a replay must reach the reduce-scatter (accumulation may have turned it off)
            m.set_requires_gradient_sync(True, recurse=False)
        self._record, self._replaying, self._replayed = record, True, []
        try:
            loss.backward(seed)
        finally:
            self._record, self._replaying, self._replayed = None, False, []
            for p, g in zip(self.params, saved):
                p.grad = g
            for m, setting in zip(self._modules, sync):  # the user's own setting, as it was
                _restore_sync(m, setting)

    # --------------------------------------------------------------------------------------- the checks

    def reduced(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else local_tensor(p.grad) for p in self.params]

    def weights(self) -> list[torch.Tensor]:
        return [local_tensor(p.detach()) for p in self.params]

    def close(self) -> None:
        self._record = None
