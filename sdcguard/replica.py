"""Cross-replica checks: after the data-parallel reduction every replica must hold bit-identical gradients, and
after the optimizer step bit-identical weights. A replica that differs was corrupted on its own device (memory,
a faulty collective, a bad optimizer kernel).

Each rank fingerprints its tensors (one :func:`sdcguard.fingerprint` per parameter, all in one batch), the ranks
all-gather those few bytes (one fixed-size ``all_gather_single``, formerly ``all_gather_into_tensor``), and a majority vote per parameter names
the minority rank(s). With two ranks, or without a strict majority, every disagreeing rank is a suspect.

Never hangs a job: each check issues exactly one collective of a size fixed at construction, on every rank,
whatever it found; the vote runs on the gathered values, so all ranks reach the same verdict.

What is compared: plain parameters of the (DDP-unwrapped) module. Sharded parameters (``DTensor`` with a
``Shard`` placement, FSDP flat parameters) hold different data on different ranks of the world; they are compared
only when an explicit ``group`` is given, which must then be the replicate dimension (HSDP), where the local
shards are replicas of each other. Otherwise they are skipped and listed in :attr:`ReplicaCheck.skipped` (with a
warning).
"""

from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .devices import cpu_id, gpu_id, hostname
from .fingerprint import fingerprints_on_device
from .records import Incident

__all__ = ["ReplicaCheck", "local_device_id", "unwrap_module"]


def unwrap_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a ``DistributedDataParallel`` (or any ``.module`` wrapper of that kind)."""
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model


def local_device_id(device: torch.device | None = None) -> str:
    """Device id of the device this rank computes on.

    CUDA: ``GPU-<uuid>`` from the device properties. CPU: ``cpu:<host>:<core>`` where core is the lowest core of
    this process's affinity mask when the process is pinned to a subset of the cores; an unpinned process has no
    core of its own, so its local rank (``LOCAL_RANK``, else the global rank, else 0) stands in for it.
    """
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return gpu_id(str(torch.cuda.get_device_properties(index).uuid))
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if affinity and len(affinity) < (os.cpu_count() or len(affinity) + 1):
        return cpu_id(min(affinity))
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        local = str(dist.get_rank()) if dist.is_available() and dist.is_initialized() else "0"
    return cpu_id(int(local))


def _is_sharded(p: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor, Replicate
    except ImportError:  # pragma: no cover - old torch
        DTensor = None  # type: ignore[assignment,misc]
    if DTensor is not None and isinstance(p, DTensor):
        return not all(isinstance(pl, Replicate) for pl in p.placements)
    return type(p).__name__ == "FlatParameter" or bool(getattr(p, "_is_flat_param", False))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


class ReplicaCheck:
    """Exact cross-replica comparison of gradients and weights, attributing a mismatch to rank(s) and a parameter.

    ``check_gradients(step)`` after the gradient reduction (before clipping and the optimizer step);
    ``check_weights(step)`` after the optimizer step, as often as the caller likes. Both are collectives: every
    rank of ``group`` must call them in the same order. Constructing one is a collective too.

    Ranks in incidents are global ranks.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        group: Any = None,
        job: str | None = None,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ReplicaCheck needs torch.distributed initialised (init_process_group) first")
        self.module = unwrap_module(model)
        self.group = group
        self.job = job
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._global_ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.world_size)]
        named: list[tuple[str, torch.nn.Parameter]] = []
        skipped: list[str] = []
        for name, p in self.module.named_parameters():
            if _is_sharded(p) and group is None:
                skipped.append(name)
            else:
                named.append((name, p))
        self.names: tuple[str, ...] = tuple(n for n, _ in named)
        """Parameters compared, in module order."""
        self.skipped: tuple[str, ...] = tuple(skipped)
        """Sharded parameters left out (no explicit replicate group was given)."""
        self._params = [p for _, p in named]
        self._warned_odd = False
        first = self._params[0].device if self._params else torch.device("cpu")
        backend = dist.get_backend(group)
        self._comm_device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        me = (local_device_id(first), hostname(), [(n, _local(p).numel(), str(p.dtype)) for n, p in named])
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, me, group=group)
        self.devices: tuple[str, ...] = tuple(e[0] for e in everyone)
        """Device id of every rank of the group, by group rank."""
        self.hosts: tuple[str, ...] = tuple(e[1] for e in everyone)
        # Every rank sees the same gathered list, so a mismatch raises on all ranks alike (no rank left waiting).
        layouts = {repr(e[2]) for e in everyone}
        if len(layouts) != 1:
            raise RuntimeError(
                "ReplicaCheck: the ranks hold different parameter sets (names, sizes or dtypes differ); "
                "they are not replicas of each other"
            )
        if skipped:
            warnings.warn(
                f"ReplicaCheck: {len(skipped)} sharded parameter(s) not compared across replicas (pass the "
                f"replicate-dimension group to compare local shards): {', '.join(skipped[:5])}"
                + (" ..." if len(skipped) > 5 else ""),
                stacklevel=2,
            )

    # ------------------------------------------------------------------------------------------------------------
    def check_gradients(self, step: int) -> list[Incident]:
        """Compare the reduced gradients across replicas; a missing gradient counts as its own value."""
        return self._check("gradient_replica", step, [p.grad for p in self._params])

    def check_weights(self, step: int) -> list[Incident]:
        """Compare the parameters themselves across replicas (after the optimizer step)."""
        return self._check("weight_replica", step, [p.detach() for p in self._params])

    def gather(self, tensors: Iterable[torch.Tensor | None], extra: Sequence[int] = ()) -> torch.Tensor:
        """All-gathered fingerprints, shape ``(world_size, len(tensors) + len(extra))`` int64, on the host (one
        collective). ``extra``: int64 values each rank contributes alongside (the last columns), so a caller can
        share a few flags without a collective of its own."""
        items = [None if t is None else _local(t) for t in tensors]
        # Only dense tensors have raw bits to fingerprint. Anything else (a sparse gradient) gets a fixed value
        # instead of an exception: raising here on one rank would leave the others waiting in the collective.
        dense = [
            t is not None and t.layout == torch.strided and not t.is_quantized and t.device.type != "meta"
            for t in items
        ]
        labels = self.names if len(items) == len(self.names) else [str(i) for i in range(len(items))]
        odd = [n for n, t, d in zip(labels, items, dense) if t is not None and not d]
        if odd and not self._warned_odd:
            warnings.warn(f"ReplicaCheck: not comparing non-dense tensors of {', '.join(odd[:5])}", stacklevel=3)
            self._warned_odd = True
        present = [t for t, d in zip(items, dense) if d]
        fps = fingerprints_on_device(present).to(self._comm_device) if present else None
        # No gradient -> 0, non-dense -> 1: fixed values, so a rank missing a gradient that others have stands out.
        local = torch.tensor([0 if t is None else 1 for t in items] + list(extra), dtype=torch.int64,
                             device=self._comm_device)
        if fps is not None:
            local[torch.tensor(dense + [False] * len(extra), device=self._comm_device)] = fps
        gathered = torch.empty(self.world_size * len(local), dtype=torch.int64, device=self._comm_device)
        # torch 2.13 renamed all_gather_into_tensor to all_gather_single (same arguments); support both.
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        all_gather(gathered, local, group=self.group)
        return gathered.view(self.world_size, len(local)).cpu()

    def _check(self, kind: str, step: int, tensors: list[torch.Tensor | None]) -> list[Incident]:
        table = self.gather(tensors).tolist()  # the one host sync
        suspects: set[int] = set()
        differing: list[str] = []
        undecided = False
        for j, name in enumerate(self.names):
            column = [row[j] for row in table]
            minority = _minority(column)
            if minority:
                differing.append(name)
                suspects.update(minority)
                undecided |= len(minority) == self.world_size
        if not differing:
            return []
        ranks = sorted(suspects)
        what = "gradients" if kind == "gradient_replica" else "weights"
        more = f" and {len(differing) - 1} more" if len(differing) > 1 else ""
        settled = (
            "no strict majority: every disagreeing rank is a suspect"
            if undecided
            else f"outvoted by a strict majority of the {self.world_size} replicas"
        )
        global_ranks = tuple(self._global_ranks[r] for r in ranks)
        return [
            Incident(
                kind=kind,
                step=step,
                suspect_ranks=global_ranks,
                device=self.devices[ranks[0]],
                detail=(
                    f"{what} of {differing[0]}{more} differ bitwise across replicas at step {step}; suspect rank(s) "
                    f"{', '.join(map(str, global_ranks))} ({settled})"
                ),
                devices=tuple(self.devices[r] for r in ranks),
                hosts=tuple(self.hosts[r] for r in ranks),
                parameter=differing[0],
                job=self.job,
            )
        ]


def _minority(values: list[int]) -> list[int]:
    """Group ranks whose value differs from a strict majority; without one, every rank (all disagree)."""
    counts = collections.Counter(values)
    if len(counts) == 1:
        return []
    value, n = counts.most_common(1)[0]
    if n * 2 > len(values):
        return [r for r, v in enumerate(values) if v != value]
    return list(range(len(values)))
