"""Faulty hardware inside a torch training job: corrupt aten op outputs, gradients, weights and collectives.

Every corruption here is planned by :class:`sdcguard.inject.faults.FaultModel` (the one definition of what a
fault does); this module only finds the target tensor, lets the model read the raw bits of the elements it
chose, and writes the planned bits back with torch indexing (on the tensor's own device, no full host copy).

- :class:`OpFaultMode`: a ``TorchDispatchMode`` corrupting the output of chosen aten ops (families in
  :data:`OP_FAMILIES`) in forward and/or backward, on one rank, at chosen steps and occurrences.
- :func:`corrupt_gradients_`: one rank's gradients after the reduction (call it after ``backward``).
- :func:`corrupt_weights_`: one rank's weights in memory.
- :func:`corrupt_all_reduce` and :class:`CorruptingCommHook`: a collective's result on one rank.

Each returns (and the mode / hook keeps in ``records``) a :class:`TorchFaultRecord` per changed element; the mode
and the hook also keep a :class:`~sdcguard.inject.drills.DrillLog` (``.drill``) that says by the end of the run
when they injected nothing, and why (``.drill.summary()`` says what they did).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import BadInput
from ..fingerprints import is_dtensor_type, is_wrapper_type, local_tensor
from . import formats as _formats
from .drills import DrillLog
from .faults import Fault, FaultModel, FaultRecord
from .ops import OP_FAMILIES, resolve_ops

__all__ = [
    "OP_FAMILIES",
    "Phase",
    "OpFaultMode",
    "TorchFaultRecord",
    "current_rank",
    "corrupt_tensor_",
    "corrupt_gradients_",
    "corrupt_weights_",
    "corrupt_all_reduce",
    "CorruptingCommHook",
]

Phase = Literal["forward", "backward", "both"]


_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
_NP_INT = {8: np.uint8, 16: np.int16, 32: np.int32, 64: np.int64}


@dataclass(frozen=True, kw_only=True)
class TorchFaultRecord(FaultRecord):
    """Exactly what one fault did to one element of a torch tensor: the bits (:class:`FaultRecord`) and where in
    the training job it happened."""

    target: str
    """What was hit: the aten op (``aten.mm``), ``grad:<param>``, ``weight:<param>``, ``all_reduce``,
    ``comm_hook:bucket<i>``, or the caller's label."""
    rank: int
    step: int | None
    phase: Literal["forward", "backward"] | None
    """Ops only: whether the op ran in the autograd backward pass."""
    occurrence: int | None
    """Ops only: index of this op call among the matching calls of its step."""
    shape: tuple[int, ...]
    """Shape of the tensor; ``index`` is a flat index in C order of it."""


def current_rank() -> int:
    """This process's rank in the default group (0 without torch.distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def _as_model(fault: Fault | FaultModel) -> FaultModel:
    if isinstance(fault, FaultModel):
        return fault
    if isinstance(fault, Fault):
        return FaultModel(fault)
    raise BadInput(f"expected a Fault or FaultModel, got {type(fault).__name__}")


def _steps(steps: int | Iterable[int] | None) -> frozenset[int] | None:
    if steps is None:
        return None
    if isinstance(steps, int):
        return frozenset((steps,))
    return frozenset(int(s) for s in steps)


def _supported(t: Any) -> bool:
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.is_complex() or t.dtype == torch.bool:
        return False
    if t.is_sparse or t.is_quantized or t.device.type == "meta":  # no raw bits to corrupt
        return False
    return str(t.dtype).removeprefix("torch.") in _formats.FORMATS


class _Segments:
    """Several tensors of one dtype seen as one flat array of raw bits, in order: where an element lives, its bits."""

    def __init__(self, segments: Sequence[tuple[str, torch.Tensor]], fmt: _formats.BitFormat) -> None:
        self.segments = segments
        self.fmt = fmt
        # Raw bits as a same-width integer view; 0-d tensors as 1-element views so they can be indexed.
        raws = [t.detach().view(_INT[fmt.width]) for _, t in segments]
        self.raws = [r if r.dim() > 0 else r.reshape(1) for r in raws]
        sizes = np.array([r.numel() for r in self.raws], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        # contiguous tensors are indexed through a flat view (one index tensor), others by coordinates
        self.flats = [r.view(-1) if r.is_contiguous() else None for r in self.raws]

    def split(self, idx: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(segment, positions in idx, indices within the segment)`` for each segment ``idx`` touches."""
        seg = np.searchsorted(self.offsets, idx, side="right") - 1
        out = []
        for s in np.unique(seg).tolist():
            sel = np.flatnonzero(seg == s)
            out.append((s, sel, idx[sel] - self.offsets[s]))
        return out

    def at(self, s: int, local: np.ndarray) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """A view of segment ``s`` and the index tensors that address ``local`` in it."""
        raw = self.raws[s]
        flat = self.flats[s]
        if flat is not None:
            return flat, (torch.from_numpy(local).to(raw.device),)
        return raw, tuple(torch.from_numpy(c).to(raw.device) for c in np.unravel_index(local, tuple(raw.shape)))

    def read_bits(self, idx: np.ndarray) -> np.ndarray:
        out = np.empty(idx.size, dtype=np.uint64)
        for s, sel, local in self.split(np.asarray(idx, dtype=np.int64)):
            view, where = self.at(s, local)
            out[sel] = view[where].cpu().numpy().view(self.fmt.uint).astype(np.uint64)
        return out

    def eligible(self, value_range: tuple[float, float]) -> np.ndarray:
        """The flat indices of the values in ``value_range`` (Fault.in_range's rule: lo <= v < hi, NaN never)."""
        lo, hi = value_range
        parts = []
        for (_, t), off in zip(self.segments, self.offsets[:-1].tolist(), strict=True):
            v = t.detach().to(torch.float64).reshape(-1)
            parts.append(torch.nonzero((v >= lo) & (v < hi)).reshape(-1).cpu().numpy() + off)
        return np.concatenate(parts).astype(np.int64)


def _corrupt_segments_(
    segments: Sequence[tuple[str, torch.Tensor]],
    model: FaultModel,
    *,
    rank: int,
    step: int | None,
    phase: Literal["forward", "backward"] | None = None,
    occurrence: int | None = None,
) -> list[TorchFaultRecord]:
    """One computation of ``model`` over several tensors seen as one flat array (in order); in place (a ``DTensor``
    in this rank's shard, with no collective: the fault is this rank's device's)."""
    if not segments:
        return []
    segments = [(name, local_tensor(t)) for name, t in segments]
    dtypes = {t.dtype for _, t in segments}
    if len(dtypes) != 1:
        raise BadInput(f"tensors of one fault target must share a dtype, got {sorted(map(str, dtypes))}")
    fmt = _formats.get(str(segments[0][1].dtype))
    flat = _Segments(segments, fmt)
    value_range = model.fault.value_range
    with torch.no_grad():
        plan = model.plan(
            int(flat.offsets[-1]),
            fmt,
            read_bits=flat.read_bits,
            eligible=(lambda: flat.eligible(value_range)) if value_range is not None else None,
            shape=tuple(flat.raws[0].shape) if len(flat.raws) == 1 else None,
        )
        if not plan:
            return []
        idx = np.array([r.index for r in plan], dtype=np.int64)
        after = np.array([r.after for r in plan], dtype=np.uint64).astype(fmt.uint).view(_NP_INT[fmt.width])
        records = []
        for s, sel, local in flat.split(idx):
            view, where = flat.at(s, local)
            view[where] = torch.from_numpy(after[sel].copy()).to(flat.raws[s].device)
            label, t = segments[s]
            for j, li in zip(sel.tolist(), local.tolist(), strict=True):
                r = plan[j]
                records.append(
                    TorchFaultRecord(
                        target=label,
                        rank=rank,
                        step=step,
                        phase=phase,
                        occurrence=occurrence,
                        shape=tuple(t.shape),
                        dtype=fmt.name,
                        index=int(li),
                        before=r.before,
                        after=r.after,
                        effect=r.effect,
                        call=r.call,
                        control=r.control,
                    )
                )
    return records


def corrupt_tensor_(
    t: torch.Tensor, fault: Fault | FaultModel, *, target: str = "tensor", step: int | None = None
) -> list[TorchFaultRecord]:
    """One computation of the fault on ``t``, in place (any device, dtype and strides); what changed."""
    if not _supported(local_tensor(t)):
        raise BadInput(f"cannot inject faults into a {t.dtype} tensor of {t.numel()} elements")
    return _corrupt_segments_([(target, t)], _as_model(fault), rank=current_rank(), step=step)


def _named(params: torch.nn.Module | Iterable[Any], names: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, torch.nn.Module):
        items = list(params.named_parameters())
    else:
        items = [p if isinstance(p, tuple) else (str(i), p) for i, p in enumerate(params)]
    return [(n, p) for n, p in items if fnmatch.fnmatchcase(n, names)]


def corrupt_gradients_(
    params: torch.nn.Module | Iterable[Any],
    fault: Fault | FaultModel,
    *,
    rank: int | None = None,
    step: int | None = None,
    names: str = "*",
) -> list[TorchFaultRecord]:
    """Corrupt this rank's ``.grad`` tensors in place, as if its memory or reduction went wrong after
    ``backward`` (DDP has already all-reduced them: other replicas keep the correct values).

    ``params``: a module, or ``(name, parameter)`` pairs, or parameters. The gradients of the parameters whose
    name matches the glob ``names`` are one flat target (in parameter order), so ``elements=1`` corrupts one
    value somewhere among them. Only on ``rank`` (None: every rank); elsewhere nothing happens and the model's
    counter does not move. Use a ``FaultModel`` across steps so transient / intermittent timings hold.
    """
    model = _as_model(fault)
    if rank is not None and current_rank() != rank:
        return []
    segs = [(f"grad:{n}", p.grad) for n, p in _named(params, names) if p.grad is not None]
    if not segs:
        raise BadInput(f"no parameter matching {names!r} has a gradient: call it after backward")
    return _corrupt_segments_(segs, model, rank=current_rank(), step=step)


def corrupt_weights_(
    params: torch.nn.Module | Iterable[Any],
    fault: Fault | FaultModel,
    *,
    rank: int | None = None,
    step: int | None = None,
    names: str = "*",
) -> list[TorchFaultRecord]:
    """Corrupt this rank's parameters in memory (in place), as a bad HBM cell or a faulty optimizer update would.

    Same selection rules as :func:`corrupt_gradients_`.
    """
    model = _as_model(fault)
    if rank is not None and current_rank() != rank:
        return []
    segs = [(f"weight:{n}", p.detach()) for n, p in _named(params, names)]
    if not segs:
        raise BadInput(f"no parameter matches {names!r}")
    return _corrupt_segments_(segs, model, rank=current_rank(), step=step)


def corrupt_all_reduce(
    tensor: torch.Tensor,
    fault: Fault | FaultModel,
    *,
    rank: int,
    op: Any = None,
    group: Any = None,
    step: int | None = None,
) -> list[TorchFaultRecord]:
    """``dist.all_reduce(tensor)`` on every rank (collectives stay in lockstep), then the result is corrupted
    in place on ``rank`` only, as a faulty link or reduction kernel would. Returns this rank's records."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group)
    if current_rank() != rank:
        return []
    return _corrupt_segments_([("all_reduce", tensor)], _as_model(fault), rank=rank, step=step)


class CorruptingCommHook:
    """A DDP communication hook: the usual all-reduce (or ``base``), then the reduced bucket corrupted on
    ``rank`` at ``steps``. Set ``hook.step`` each step; records land in ``hook.records``.

    ``ddp_model.register_comm_hook(state=None, hook=CorruptingCommHook(fault, rank=1, steps=[3]))``
    """

    def __init__(
        self, fault: Fault | FaultModel, *, rank: int, steps: int | Iterable[int] | None = None, base: Any = None
    ) -> None:
        self.model = _as_model(fault)
        self.rank = rank
        self.steps = _steps(steps)
        self.step: int | None = None
        self.records: list[TorchFaultRecord] = []
        self.drill = DrillLog(self, rank=rank, steps=self.steps)
        if base is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            base = allreduce_hook
        self.base = base
        # DDP reads a hook's __name__ and __qualname__, as if it were a function
        self.__name__ = self.__qualname__ = "CorruptingCommHook"

    def _active(self) -> bool:
        return self.drill.gate(current_rank(), self.step, self.steps)

    def __call__(self, state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        fut = self.base(state, bucket)
        if not self._active():
            return fut
        label, step = f"comm_hook:bucket{bucket.index()}", self.step

        def corrupt(f: torch.futures.Future[Any]) -> torch.Tensor:
            value = f.value()
            t = value[0] if isinstance(value, (list, tuple)) else value
            self.drill.add(self.records, _corrupt_segments_([(label, t)], self.model, rank=self.rank, step=step))
            return t

        return fut.then(corrupt)


# DDP checks a hook's annotations against the real classes; with postponed annotations they would be strings.
CorruptingCommHook.__call__.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)


class OpFaultMode(TorchDispatchMode):
    """Corrupts the output of chosen aten ops, as a faulty GPU would, and records exactly what it changed.

    ``ops``: a family from :data:`~.ops.OP_FAMILIES` (``"matmul"``), an aten op (``"mm"``, ``"aten.addmm"``), or a
    list. A ``DTensor`` op is corrupted in the plain op it runs on this rank's shard.
    ``phase``: ops of the ``forward`` pass, the autograd ``backward`` pass, or ``both``.
    ``rank``: only on this rank of the default group (None: every rank).
    ``steps``: only while ``mode.step`` (set by the caller every step) is one of these (None: always).
    ``occurrence``: only the k-th (0-based) matching op call of each step (None: every matching call).
    ``output``: which output of a multi-output op (``native_layer_norm`` returns out, mean, rstd).
    Each matching call is one computation of the fault model, so the fault's timing applies on top:
    transient = the first matching call only, sticky = every one, intermittent = each with ``rate``.

    Usage::

        mode = OpFaultMode(Fault(pattern="bitflip", bit="exponent"), ops="matmul", rank=1, steps=[5])
        with mode:
            for step in range(10):
                mode.step = step
                loss = model(batch).sum(); loss.backward()
        mode.records   # [TorchFaultRecord(target="aten.addmm", rank=1, step=5, ...)]
    """

    def __init__(
        self,
        fault: Fault | FaultModel,
        *,
        ops: str | Iterable[str] = "matmul",
        phase: Phase = "both",
        rank: int | None = None,
        steps: int | Iterable[int] | None = None,
        occurrence: int | None = None,
        output: int = 0,
    ) -> None:
        super().__init__()
        if phase not in ("forward", "backward", "both"):
            raise BadInput(f"phase must be forward, backward or both, got {phase!r}")
        if occurrence is not None and occurrence < 0:
            raise BadInput(f"occurrence must be >= 0, got {occurrence}")
        self.model = _as_model(fault)
        self.ops = resolve_ops(ops)
        self.phase = phase
        self.rank = rank
        self.steps = _steps(steps)
        self.occurrence = occurrence
        self.output = output
        self.step: int | None = None
        """The caller's training step; set it before each step."""
        self.records: list[TorchFaultRecord] = []
        self.drill = DrillLog(self, rank=rank, steps=self.steps, ops=ops, phase=phase)
        self._count_step: int | None = None
        self._count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(is_dtensor_type(t) for t in types):  # a DTensor op: corrupt the plain op it runs on this rank's shard
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if any(is_wrapper_type(t) for t in types):  # fake tensors of DTensor's sharding propagation: no data
            return out
        if func.namespace != "aten" or func.overloadpacket.__name__ not in self.ops:
            return out
        phase: Literal["forward", "backward"] = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        if self.phase != "both" and phase != self.phase:
            return out
        rank = current_rank()
        if not self.drill.gate(rank, self.step, self.steps):
            return out
        target = out[self.output] if isinstance(out, (tuple, list)) else out
        if not _supported(target) or is_wrapper_type(type(target)):
            return out
        if self._count_step != self.step:
            self._count_step, self._count = self.step, 0
        occurrence = self._count
        self._count += 1
        if self.occurrence is not None and occurrence != self.occurrence:
            return out
        self.drill.add(
            self.records,
            _corrupt_segments_(
                [(f"aten.{func.overloadpacket.__name__}", target)],
                self.model,
                rank=rank,
                step=self.step,
                phase=phase,
                occurrence=occurrence,
            ),
        )
        return out
