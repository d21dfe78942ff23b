"""What a restore needs, as one flat list of tensors and a skeleton: the module's parameters and buffers, the
optimizer's state and whatever the user's stateful objects return (schedulers, a data loader's position, random
states).

:func:`flatten` walks a nested value (dicts, lists, tuples) and takes every tensor out, leaving its index in the
skeleton; :func:`unflatten` puts tensors back. The skeleton holds the plain values (learning rates, counters), so
two states are equal when their tensors' bits and their skeletons' pickles are: :func:`state_digest` is one number
for both (:func:`sdcguard.fingerprint` of every tensor, a hash of the skeleton), what the votes compare.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ...errors import BadInput
from ...fingerprints import combine, is_dtensor_type, local_tensor

__all__ = ["Stateful", "Slot", "ShardSlot", "flatten", "unflatten", "skeleton_hash", "state_digest", "LiveState"]


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``: an optimizer, a scheduler, a data loader's state."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass(frozen=True)
class Slot:
    """Where a tensor was in a skeleton: its index in the flat list."""

    index: int


@dataclass(frozen=True)
class ShardSlot(Slot):
    """Where a ``DTensor`` was (an FSDP2 parameter's optimizer state): the flat list holds its local shard; its
    placements, global shape and stride come back with it (:func:`unflatten`'s ``place``). Its mesh does not: a
    recovery may have moved the job onto another one (:mod:`.remesh`)."""

    placements: tuple[tuple[Any, ...], ...]
    """Plain values (:func:`_plain`), so equal states pickle alike (placement objects pickle with references)."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _plain(placement: Any) -> tuple[Any, ...]:
    """A ``DTensor`` placement as plain values: ``("replicate",)``, ``("shard", dim)``, ``("strided", dim, split)``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(placement, _StridedShard):
        return ("strided", placement.dim, placement.split_factor)
    if isinstance(placement, Shard):
        return ("shard", placement.dim)
    if isinstance(placement, Replicate):
        return ("replicate",)
    raise BadInput(f"a DTensor in the training state has a {placement} placement: a snapshot keeps Shard and Replicate")


def _placement(plain: tuple[Any, ...]) -> Any:
    """The placement :func:`_plain` took apart."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if plain[0] == "strided":
        return _StridedShard(plain[1], split_factor=plain[2])
    return Shard(plain[1]) if plain[0] == "shard" else Replicate()


Place = Callable[[torch.Tensor, ShardSlot], torch.Tensor]
"""Turns a local shard back into a ``DTensor`` (:meth:`LiveState.write`)."""


def flatten(value: Any, out: list[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a :class:`Slot` (a ``DTensor``: its local shard, and a
    :class:`ShardSlot`); the tensors are appended to ``out`` in order."""
    if is_dtensor_type(type(value)):
        out.append(local_tensor(value))
        placements = tuple(_plain(p) for p in value.placements)
        return ShardSlot(len(out) - 1, placements, tuple(value.shape), tuple(value.stride()))
    if isinstance(value, torch.Tensor):
        out.append(value)
        return Slot(len(out) - 1)
    if isinstance(value, dict):
        return type(value)((k, flatten(v, out)) for k, v in value.items())
    if isinstance(value, list):
        return [flatten(v, out) for v in value]
    if isinstance(value, tuple):
        return tuple(flatten(v, out) for v in value)
    return value


def unflatten(skeleton: Any, tensors: Sequence[torch.Tensor], place: Place | None = None) -> Any:
    """The value :func:`flatten` took apart, with ``tensors`` in the slots (``place``: what a :class:`ShardSlot`'s
    local shard becomes; None: the local shard itself)."""
    if isinstance(skeleton, ShardSlot) and place is not None:
        return place(tensors[skeleton.index], skeleton)
    if isinstance(skeleton, Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return type(skeleton)((k, unflatten(v, tensors, place)) for k, v in skeleton.items())
    if isinstance(skeleton, list):
        return [unflatten(v, tensors, place) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(unflatten(v, tensors, place) for v in skeleton)
    return skeleton


def skeleton_hash(skeleton: Any) -> int:
    """A 64-bit hash of the skeleton's plain values (pickled: floats by their bits)."""
    return int.from_bytes(hashlib.sha256(pickle.dumps(skeleton, protocol=4)).digest()[:8], "little")


def state_digest(fingerprints: Sequence[int], skeleton: Any) -> int:
    """One number for a state: its tensors' fingerprints and its skeleton (equal states, equal digests)."""
    return combine([*fingerprints, skeleton_hash(skeleton)])


class LiveState:
    """The training state a snapshot keeps and a restore writes back: the module's ``state_dict`` (parameters and
    buffers, this rank's local shard of a ``DTensor``), the optimizer's, and each stateful object's.

    Args:
        module: the module without data-parallel wrapper.
        optimizer: its optimizer (None: parameters and buffers only).
        extra: more stateful objects (:class:`Stateful`), in a fixed order on every rank.
    """

    def __init__(self, module: nn.Module, optimizer: Stateful | None, extra: Sequence[Stateful] = ()) -> None:
        for obj in [*([optimizer] if optimizer is not None else []), *extra]:
            if not isinstance(obj, Stateful):
                raise BadInput(f"state objects need state_dict() and load_state_dict(); {type(obj).__name__} has not")
        self.module = module
        self.optimizer = optimizer
        self.extra = list(extra)

    def read(self) -> tuple[Any, list[torch.Tensor]]:
        """The live state as (skeleton, tensors): references to the live tensors, not copies."""
        tensors: list[torch.Tensor] = []
        whole = {
            "module": {k: local_tensor(v.detach()) for k, v in self.module.state_dict(keep_vars=True).items()},
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "extra": [obj.state_dict() for obj in self.extra],
        }
        return flatten(whole, tensors), tensors

    def fits(self, skeleton: Any, tensors: Sequence[torch.Tensor]) -> str | None:
        """Why a kept state cannot be written into this one (another model: its parameters' and buffers' names,
        shapes or dtypes differ), or None. The optimizer's state may be empty here (before its first step)."""
        try:
            kept = unflatten(skeleton["module"], tensors)
        except (KeyError, IndexError, TypeError):
            return "not a state this guard keeps"
        live = {k: local_tensor(v.detach()) for k, v in self.module.state_dict(keep_vars=True).items()}
        if sorted(kept) != sorted(live):
            return "another model's state (its parameters' and buffers' names differ)"
        if any((kept[k].shape, kept[k].dtype) != (v.shape, v.dtype) for k, v in live.items()):
            return "another model's state (its tensors' shapes or dtypes differ)"
        return None

    def write(
        self, skeleton: Any, tensors: Sequence[torch.Tensor], clone: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """Write a state back: the module's tensors copied in place (their storage stays the one the optimizer
        and the hooks hold), the optimizer's and the others' loaded from ``clone``\\ s of the kept tensors (a load
        may keep the tensors it is given and change them later: never the snapshot's own)."""
        live = self.module.state_dict(keep_vars=True)
        with torch.no_grad():
            for key, value in unflatten(skeleton["module"], tensors).items():
                local_tensor(live[key].detach()).copy_(value)
        cloned = _Cloned(tensors, clone)
        place = self._place
        if self.optimizer is not None:
            self.optimizer.load_state_dict(unflatten(skeleton["optimizer"], cloned, place))
        for obj, skel in zip(self.extra, skeleton["extra"]):
            obj.load_state_dict(unflatten(skel, cloned, place))

    def _place(self, local: torch.Tensor, slot: ShardSlot) -> torch.Tensor:
        """A kept local shard as the ``DTensor`` it was, on the mesh the module's parameters are on now (a job
        that recovers has one: an FSDP2/HSDP mesh, :mod:`.setup`)."""
        from torch.distributed.tensor import DTensor

        mesh = next(
            (getattr(p, "device_mesh", None) for p in self.module.parameters() if is_dtensor_type(type(p))), None
        )
        if mesh is None:
            raise BadInput("a kept state holds DTensors, but the module's parameters are not DTensors")
        return DTensor.from_local(
            local,
            mesh,
            [_placement(p) for p in slot.placements],
            run_check=False,
            shape=torch.Size(slot.shape),
            stride=slot.stride,
        )


class _Cloned(Sequence[torch.Tensor]):
    """``tensors``, each cloned when it is read (only the slots a skeleton names are)."""

    def __init__(self, tensors: Sequence[torch.Tensor], clone: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.tensors, self.clone = tensors, clone

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, i: Any) -> Any:
        return self.clone(self.tensors[i])
