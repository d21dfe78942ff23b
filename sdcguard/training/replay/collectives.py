"""What each rank of a *unit* (a tensor-, context- or expert-parallel group: the ranks that compute one micro-batch
together) puts into the unit's collectives while it computes a recorded micro-batch: the *trace*, one fingerprint per
collective in call order, kept in the computation's :class:`~..digest.LocalRecord`.

Why: a fault whose result crosses the unit's collectives spoils every shard the unit computes after it, so the
shards' fingerprints name every member (:mod:`..verdicts.units`). The traces say where it started. Every rank of a
unit issues the same collectives in the same order, and so does every unit computing the same micro-batch (an
original, its replay by another unit, the reruns), so the k-th entries of two computations' traces at one tensor-
parallel coordinate are that coordinate's contributions to the same collective. Up to the first collective where
any contribution differs, every rank computed from the same inputs; the coordinates whose contributions differ
there computed differently on their own (:func:`~..verdicts.units.first_to_differ`).

A dispatch mode sees the collectives torch.distributed issues as ops (``c10d`` and ``_c10d_functional``: DTensor's
redistributions, ``all_to_all_single``) and fingerprints each one's input, before it runs, when its group lies
within the unit. It leaves a DTensor's ops to DTensor, so the plain ops it runs, the collectives of an implicit
redistribution included, pass through the mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...fingerprints import is_dtensor_type, is_wrapper_type
from ..digest import LocalRecord

__all__ = ["CollectiveTracer", "unit_tracer"]

TRACED = frozenset(
    {
        "_c10d_functional.all_reduce",
        "_c10d_functional.all_reduce_",
        "_c10d_functional.all_reduce_coalesced",
        "_c10d_functional.all_reduce_coalesced_",
        "_c10d_functional.all_gather_into_tensor",
        "_c10d_functional.all_gather_into_tensor_out",
        "_c10d_functional.all_gather_into_tensor_coalesced",
        "_c10d_functional.reduce_scatter_tensor",
        "_c10d_functional.reduce_scatter_tensor_coalesced",
        "_c10d_functional.all_to_all_single",
        "c10d.allreduce_",
        "c10d.allreduce_coalesced_",
        "c10d.allgather_",
        "c10d._allgather_base_",
        "c10d.allgather_coalesced_",
        "c10d.allgather_into_tensor_coalesced_",
        "c10d.reduce_scatter_",
        "c10d._reduce_scatter_base_",
        "c10d.reduce_scatter_tensor_coalesced_",
        "c10d.alltoall_",
        "c10d.alltoall_base_",
    }
)
"""The collectives whose every rank contributes an input (a broadcast's or a scatter's non-root buffers are not
contributions: they are left out)."""
_INPUTS = ("input", "inputs", "tensors", "input_tensor", "input_tensors")
"""Schema names of a collective's input argument (``tensors``: an in-place all-reduce, read before it runs)."""
_GROUPS = ("group_name", "process_group")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class CollectiveTracer(TorchDispatchMode):
    """Fingerprints the inputs of the collectives over groups within ``unit`` (global ranks) into the record it is
    tracing for (:meth:`tracing`, or :meth:`start` and :meth:`stop` around a recorded micro-batch of the step)."""

    def __init__(self, unit: Sequence[int]) -> None:
        super().__init__()
        self.unit = frozenset(unit)
        self.enabled = True
        """False: traces nothing (``benchmarks/tp_overhead.py`` measures what tracing costs)."""
        self._record: LocalRecord | None = None
        self._within: dict[str, bool] = {}
        self._kinds: dict[tuple[type, ...], tuple[bool, bool]] = {}
        self._ops: dict[Any, bool] = {}

    @contextlib.contextmanager
    def tracing(self, record: LocalRecord) -> Iterator[None]:
        """Trace into ``record`` for the duration (a replay's forward and backward)."""
        self.start(record)
        try:
            yield
        finally:
            self.stop()

    def start(self, record: LocalRecord) -> None:
        """Trace into ``record`` until :meth:`stop` (the mode is pushed: stop it before any mode pushed later)."""
        if self._record is not None:
            raise RuntimeError("the collective tracer is already tracing")
        if not self.enabled:
            return
        self._record = record
        self.__enter__()

    def stop(self) -> None:
        if self._record is not None:
            self._record = None
            self.__exit__(None, None, None)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kinds = self._kinds.get(types)  # every op of the forward and backward passes here: what it asks is cached
        if kinds is None:
            dtensor = any(is_dtensor_type(t) for t in types)
            kinds = self._kinds[types] = (dtensor, not any(is_wrapper_type(t) for t in types))
        dtensor, plain = kinds  # plain: not a fake tensor of DTensor's sharding propagation
        if dtensor:
            return NotImplemented  # a DTensor runs its plain ops, its implicit redistributions included, past this mode
        kwargs = kwargs or {}
        traced = self._ops.get(func)
        if traced is None:
            traced = self._ops[func] = str(func.overloadpacket) in TRACED
        if traced and plain and self._record is not None:
            named = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
            group = next((named[g] for g in _GROUPS if g in named), None)
            inputs = next((_tensors(named[i]) for i in _INPUTS if i in named), [])
            if group is not None and inputs and self._over_unit(group):
                self._record.add_contribution(inputs)
        return func(*args, **kwargs)

    def _over_unit(self, group: Any) -> bool:
        """Whether ``group`` (a group's name, or a ``ProcessGroup`` as a c10d op carries it) lies within the unit."""
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import ProcessGroup, _resolve_process_group

        if isinstance(group, torch.ScriptObject):
            group = ProcessGroup.unbox(group)
        name = group if isinstance(group, str) else group.group_name
        if name not in self._within:
            pg = _resolve_process_group(cast(Any, name)) if isinstance(group, str) else group
            ranks = set(dist.get_process_group_ranks(pg))
            self._within[name] = len(ranks) > 1 and ranks <= self.unit
        return self._within[name]


def unit_tracer(unit: Sequence[int]) -> CollectiveTracer | None:
    """A tracer for a rank whose micro-batches are computed by ``unit`` (None when it computes them alone)."""
    return CollectiveTracer(unit) if len(unit) > 1 else None
