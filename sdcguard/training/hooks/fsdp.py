"""The guard's hooks for a model sharded with FSDP2 (``fully_shard``), HSDP included: a custom reduce-scatter.

FSDP2 gathers the parameters of each ``fully_shard`` module for its forward and backward, then hands that module's
local, unsharded gradients to a reduce-scatter, copied into one flat input laid out shard by shard. FSDP2 lets a
user choose that communication (``FSDPModule.set_custom_reduce_scatter``); the guard installs one that fingerprints
the input on its device (on sampled micro-batches) and then reduce-scatters exactly as FSDP2's default does. The
input's layout depends only on the module and the shard-group size, so a replay on any rank of the job produces
the same layout: one unit per ``fully_shard`` call (the modules of ``fully_shard([a, b])`` share one state, one
parameter group and one reduce-scatter: one unit, named ``a+b``).

Accumulation without gradient sync (``set_requires_gradient_sync(False)`` on all but the last micro-batch): FSDP2
adds each micro-batch's unsharded gradient into the unsharded parameter's ``.grad`` and hands the reduce-scatter
their sum on the last one, which no replay of one micro-batch reproduces. So the hooks also watch each unsharded
parameter (FSDP2 makes it at its first all-gather and keeps that object): a tensor hook on it sees the
parameter's gradient of one micro-batch as autograd produces it, before FSDP2 adds it to the others. A sample whose
micro-batch was not handed over on its own is compared on those gradients (the ``"produced"`` basis of
:class:`~sdcguard.training.digest.LocalRecord`, folded per unit in parameter order); its replay, one micro-batch as
always, fingerprints the same gradients through the same hooks. They are a function of the micro-batch, the
weights and the random state alone, with no sum over micro-batches in them, so there is no order of float
additions to reproduce. The alternative, replaying every accumulated micro-batch and comparing the reduce-scatter
input, would cost ``k`` forward and backward passes per sample instead of one, hold ``k`` captures, and need every
rank's replay to be as long as its peer's accumulation (FSDP2 replays are collective). What the produced basis
does not compare: the additions of the micro-batches and FSDP2's copy of their sum into the reduce-scatter input
(as under DDP's ``no_sync``, whose buckets see only the sum); under HSDP the reduced result is compared across
replicas. Its cost: on the sampled micro-batch, one more fingerprint pass over its unsharded gradients (the size of
its reduce-scatter input); on every backward, one Python call per parameter. The same hooks judge a shard group of
one rank, which FSDP2 reduces without a reduce-scatter. FSDP2 offers no public way to reach its unsharded
parameters, so they are read from torch's state; where a torch version keeps them elsewhere, such samples are not
judged, and the guard says so.

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
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from ...fingerprints import local_tensor
from ..digest import LocalRecord
from .wrappers import imported

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["FSDPTaps", "is_fsdp", "fsdp_param_groups"]


def _fsdp_module_type() -> type[FSDPModule] | None:
    """FSDP2's module class, where a model can be one: only once ``torch.distributed.fsdp`` is imported (``fully_shard``
    lives there), so the guard never imports it itself (:func:`~.wrappers.imported`)."""
    return cast("type[FSDPModule] | None", imported("torch.distributed.fsdp", "FSDPModule"))


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


def fsdp_param_groups(module: FSDPModule) -> list[Any]:
    """The parameter groups of ``module``'s FSDP2 state: torch 2.13 keeps a list (``_fsdp_param_groups``), torch 2.11
    one group or None (``_fsdp_param_group``). FSDP2 has no public accessor; AttributeError where a torch keeps
    neither. (The first GPU run, torch 2.11, read no group: no produced-gradient hook was set, and an FSDP2 step with
    a faulty matmul committed.)"""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    if not hasattr(state, "_fsdp_param_group"):
        raise AttributeError("FSDP2 state without _fsdp_param_groups or _fsdp_param_group")
    group = state._fsdp_param_group
    return [] if group is None else [group]


def _sync_setting(module: FSDPModule) -> _SyncSetting | None:
    """The module's gradient-sync setting (``reduce_grads``, ``all_reduce_grads`` of each of its parameter groups):
    FSDP2 offers a setter (``set_requires_gradient_sync``) but no getter, so this reads torch's state, and gives None
    where a torch version keeps it elsewhere."""
    try:
        return [(bool(g.reduce_grads), bool(g.all_reduce_grads)) for g in fsdp_param_groups(module)]
    except (AttributeError, TypeError):
        return None


def _restore_sync(module: FSDPModule, setting: _SyncSetting | None) -> None:
    if setting is None:  # unknown: leave sync on, the setting FSDP2 starts with
        return
    for g, (reduce, all_reduce) in zip(fsdp_param_groups(module), setting):
        g.reduce_grads, g.all_reduce_grads = reduce, all_reduce


def _units(model: nn.Module) -> list[tuple[str, nn.Module, list[nn.Parameter]]]:
    """``(name, module, its parameters)`` per unit, in module order: one per FSDP2 state, so the modules of one
    ``fully_shard([a, b])`` call (one state, one parameter group, one reduce-scatter) are one unit named
    ``a+b``. A unit's parameters are those of its modules that no nested ``fully_shard`` module holds."""
    fsdp = [(name, m) for name, m in model.named_modules() if is_fsdp(m)]
    state = _state_key(fsdp)
    owner: dict[int, int] = {}
    # innermost first: a parameter belongs to the deepest fully_shard module that holds it
    for _, m in sorted(fsdp, key=lambda nm: -nm[0].count(".") - (nm[0] != "")):
        for p in m.parameters():
            owner.setdefault(id(p), state[id(m)])
    groups: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, m in fsdp:
        groups.setdefault(state[id(m)], []).append((name or "<root>", m))
    units = []
    for key, members in groups.items():
        seen: set[int] = set()
        own = []
        for _, m in members:
            for p in m.parameters():
                if p.requires_grad and owner[id(p)] == key and id(p) not in seen:
                    seen.add(id(p))
                    own.append(p)
        if own:
            units.append(("+".join(n for n, _ in members), members[0][1], own))
    return units


def _state_key(fsdp: Sequence[tuple[str, nn.Module]]) -> dict[int, int]:
    """Module -> a key its FSDP2 state alone has (``fully_shard.state``; the module itself where it has none)."""
    from torch.distributed.fsdp import fully_shard

    state = cast(Any, fully_shard).state  # the contract's public accessor (not in fully_shard's overloads)
    return {id(m): id(state(m) or m) for _, m in fsdp}


def _unsharded(module: FSDPModule) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """``(sharded, unsharded)`` parameter pairs of ``module``'s state, for those FSDP2 has made an unsharded
    parameter for (at its first all-gather; the same object every step after). FSDP2 has no public way to reach
    them, so this reads torch's state, and gives none where a torch version keeps them elsewhere."""
    try:
        return [
            (fp.sharded_param, fp._unsharded_param)
            for g in fsdp_param_groups(module)
            for fp in g.fsdp_params
            if getattr(fp, "_unsharded_param", None) is not None
        ]
    except (AttributeError, TypeError):
        return []


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
    produces = True

    def __init__(self, model: nn.Module, *, replay_module: nn.Module | None = None) -> None:
        assert _fsdp_module_type() is not None
        self.replay_module = model if replay_module is None else replay_module
        self.replay_context = contextlib.nullcontext
        units = _units(model)
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
        index = {id(p): k for k, p in enumerate(self.params)}
        self._parts = {id(p): (u, index[id(p)]) for u, own in enumerate(self._unit_params) for p in own}
        """Sharded parameter -> (its unit, its index among the parameters): where a produced gradient goes."""
        self._hooked: set[int] = set()
        self._handles: list[Any] = []
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

    def _produced(self, unit: int, part: int, grad: torch.Tensor) -> None:
        record = self._record
        if record is not None:
            record.add_part(unit, part, local_tensor(grad))

    def _hook_unsharded(self) -> None:
        """A tensor hook on each unsharded parameter FSDP2 has made (once each): it sees the parameter's gradient of
        one micro-batch before FSDP2 accumulates it (the produced basis)."""
        for m in self._modules:
            for sharded, unsharded in _unsharded(m):
                if id(unsharded) in self._hooked or id(sharded) not in self._parts:
                    continue
                self._hooked.add(id(unsharded))
                self._handles.append(unsharded.register_hook(partial(self._produced, *self._parts[id(sharded)])))

    def arm(self, record: LocalRecord | None) -> None:
        self._record = record
        if record is not None and "produced" in record.bases:
            self._hook_unsharded()

    def replay_backward(self, loss: torch.Tensor, seed: torch.Tensor | None, record: LocalRecord) -> None:
        saved = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        sync = [_sync_setting(m) for m in self._modules]
        for m in self._modules:  # a replay must reach the reduce-scatter (accumulation may have turned it off)
            m.set_requires_gradient_sync(True, recurse=False)
        self._record, self._replaying, self._replayed = record, True, []
        if "produced" in record.bases:
            self._hook_unsharded()
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
        for h in self._handles:
            h.remove()
        self._handles = []
