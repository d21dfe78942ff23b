"""The training side's communication, in one place: which device collectives run on, and every gather, broadcast
and point-to-point message that the guard, its rounds, its shadows and its checks exchange.

Two rules hold for everything here, because a guard must never hang a job:

- a collective (``gather_*``, ``broadcast_*``, ``exchange_objects``) is issued by every member of the group, in the
  same order, whatever that member found; its size is fixed by arguments every member knows;
- NCCL moves CUDA tensors only and gloo moves CPU tensors, so :func:`comm_device` decides, once per group, where
  the buffers live. Nothing else in sdcguard picks a communication device.

Objects (captures, digests) travel pickled in a ``uint8`` tensor preceded by its length.

Replica groups that meet only through an all-reduce (torchft's manager, :class:`Allreducer`) exchange through
:func:`gather_rows_by_sum` and :func:`average_`; the same two rules hold there (every group of the quorum calls them
in the same order, sized by the quorum every group knows).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist

__all__ = [
    "Comm",
    "comm_device",
    "send_object",
    "recv_object",
    "send_stop",
    "send_tensors",
    "recv_tensors_",
    "send_tensor",
    "irecv_tensor",
    "average_bucket",
    "STOP",
    "Allreducer",
    "gather_rows_by_sum",
    "average_",
]

STOP = -1
"""Length field of the stop message that :func:`send_stop` sends and :func:`recv_object` returns as ``None``."""


def comm_device(group: Any = None) -> torch.device:
    """The device whose tensors ``group``'s backend moves: the current CUDA device for NCCL, else the CPU."""
    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(obj: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    return torch.tensor([len(data)], dtype=torch.int64, device=device), payload


def _decode(payload: torch.Tensor) -> Any:
    return pickle.loads(payload.cpu().numpy().tobytes())


class Comm:
    """The collectives of one data-parallel group, addressed by index in the group (``0 .. size-1``).

    Outside ``torch.distributed`` (a single process) it is a group of one: gathers return the caller's own value.
    """

    def __init__(self, group: Any = None, members: Sequence[int] | None = None) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.group = group
        if not self.distributed:
            self.members: list[int] = [0]
            self.rank = 0
        else:
            self.rank = dist.get_rank()
            self.members = (
                list(members)
                if members is not None
                else dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
            )
        self.size = len(self.members)
        self.index = self.members.index(self.rank) if self.rank in self.members else -1
        """This process's index in the group (-1 when it is not a member, e.g. a dedicated shadow)."""
        self.device = comm_device(group) if self.distributed else torch.device("cpu")

    @property
    def alone(self) -> bool:
        """True when there is nobody to talk to (a single process or a group of one)."""
        return not self.distributed or self.size == 1

    # ------------------------------------------------------------------------------------------- collectives

    def gather_ints(self, values: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """All-gather ``k`` int64 values from every member: a host tensor of shape ``(size, k)``.

        ``values`` may be a device tensor (left on its device until the collective needs it: no host sync before
        the one at the end). Every member must pass the same ``k``.
        """
        local = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.int64)
        local = local.reshape(-1).to(device=self.device, dtype=torch.int64)
        if self.alone:
            return local.reshape(1, -1).cpu()
        out = torch.empty(self.size * local.numel(), dtype=torch.int64, device=self.device)
        # torch 2.13 renamed all_gather_into_tensor to all_gather_single (same arguments); support both.
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        all_gather(out, local, group=self.group)
        return out.view(self.size, local.numel()).cpu()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every member's picklable object, in group order."""
        if self.alone:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """The object of member ``src`` (an index), on every member."""
        if self.alone:
            return obj
        box = [obj if self.index == src else None]
        dist.broadcast_object_list(box, src=self.members[src], group=self.group)
        return box[0]

    def broadcast_tensors_(self, tensors: Sequence[torch.Tensor], src: int) -> None:
        """Overwrite ``tensors`` on every member with member ``src``'s (same shapes and dtypes everywhere)."""
        if self.alone:
            return
        for t in tensors:
            buf = t if t.device == self.device else t.to(self.device)
            dist.broadcast(buf, src=self.members[src], group=self.group)
            if buf is not t:
                t.copy_(buf)

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every member (one small all-reduce)."""
        if self.alone:
            return flag
        box = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(box, op=dist.ReduceOp.MIN, group=self.group)
        return bool(box.item())

    def barrier(self) -> None:
        """Wait until every member is here."""
        if not self.alone:
            dist.barrier(group=self.group)

    @classmethod
    def of(cls, ranks: Sequence[int]) -> Comm:
        """The group of these global ranks (the world when they are all of it); only they call it."""
        if not (dist.is_available() and dist.is_initialized()) or sorted(ranks) == list(range(dist.get_world_size())):
            return cls()
        return cls(dist.new_group(sorted(ranks), use_local_synchronization=True))

    def reform(self, members: Sequence[int]) -> Comm | None:
        """A new group of ``members`` (global ranks) after a recovery (:mod:`.recovery`): every rank of the job calls
        it with the same ``members`` (leavers and dedicated shadows too, so no rank waits on a group nobody else
        creates); None on a rank outside it. Its order is the sorted ranks (``dist.new_group`` sorts them), which is
        the order its reductions sum in: data-parallel ranks are numbered by it (:attr:`index`)."""
        if not (dist.is_available() and dist.is_initialized()):
            return Comm() if 0 in members else None
        ranks = sorted(members)
        group = None if ranks == list(range(dist.get_world_size())) else dist.new_group(ranks)
        return Comm(group, members=ranks) if dist.get_rank() in ranks else None

    def reform_mesh(self, mesh: Any, rows: Sequence[Sequence[int]]) -> Any:
        """A device mesh like ``mesh`` (its device type and dimension names) over ``rows`` (global ranks, one row per
        position along the first dimension) after a recovery: every rank of the job calls it with the same
        ``rows`` (``DeviceMesh`` creates every row's and column's group with ``dist.new_group``); a rank outside it
        holds it with no coordinate."""
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh(mesh.device_type, [list(r) for r in rows], mesh_dim_names=mesh.mesh_dim_names)

    def split(self, groups: Sequence[Sequence[int]]) -> Comm:
        """This member's group among ``groups`` (global ranks; every member of this group is in exactly one of
        them), created collectively: every member calls it with the same ``groups``."""
        if self.alone or len(groups) == 1:
            return self
        group, _ = dist.new_subgroups_by_enumeration([sorted(g) for g in groups])
        return Comm(group)

    def exchange_objects(self, obj: Any, dst: int, src: int) -> Any:
        """Send ``obj`` to member ``dst`` and receive one object from member ``src`` (a ring step: no deadlock)."""
        if self.alone or (dst == src == self.index):
            return obj
        dst_g, src_g = self.members[dst], self.members[src]
        size, payload = _encode(obj, self.device)
        their_size = torch.zeros(1, dtype=torch.int64, device=self.device)
        for w in (dist.isend(size, dst_g, group=self.group), dist.irecv(their_size, src_g, group=self.group)):
            assert w is not None  # None only for a rank outside the group
            w.wait()
        theirs = torch.empty(int(their_size.item()), dtype=torch.uint8, device=self.device)
        for w in (dist.isend(payload, dst_g, group=self.group), dist.irecv(theirs, src_g, group=self.group)):
            assert w is not None
            w.wait()
        return _decode(theirs)


# ---------------------------------------------------------------------------------------- point to point (world)


def send_object(obj: Any, dst: int) -> list[Any]:
    """Send ``obj`` to global rank ``dst`` without blocking; keep the result alive and ``wait()`` its works."""
    device = comm_device(None)
    size, payload = _encode(obj, device)
    works = [dist.isend(size, dst), dist.isend(payload, dst)]
    return [works, size, payload]


def send_stop(dst: int) -> None:
    """Tell global rank ``dst`` (a shadow's receive loop) that this sender is done (blocking)."""
    dist.send(torch.tensor([STOP], dtype=torch.int64, device=comm_device(None)), dst)


def recv_object(src: int | None) -> tuple[Any, int]:
    """Receive one object from global rank ``src`` (any rank with ``None``): ``(object, sender)``; a stop message
    comes back as ``(None, sender)``."""
    device = comm_device(None)
    size = torch.zeros(1, dtype=torch.int64, device=device)
    sender = dist.recv(size, src=src)
    n = int(size.item())
    if n == STOP:
        return None, sender
    payload = torch.empty(n, dtype=torch.uint8, device=device)
    dist.recv(payload, src=sender)
    return _decode(payload), sender


def send_tensors(tensors: Sequence[torch.Tensor], dst: int) -> list[Any]:
    """Post non-blocking sends of ``tensors`` (as they are: no copy) to global rank ``dst``; wait the returned works
    before the tensors change."""
    device = comm_device(None)
    works = []
    for t in tensors:
        t = t.detach()
        works.append(dist.isend(t if t.device == device else t.to(device), dst))
    return works


def recv_tensors_(tensors: Sequence[torch.Tensor], src: int) -> None:
    """Receive into ``tensors`` (in place) from global rank ``src``, in order (blocking)."""
    device = comm_device(None)
    for t in tensors:
        buf = t if t.device == device else torch.empty_like(t, device=device)
        dist.recv(buf, src=src)
        if buf is not t:
            t.copy_(buf)


def send_tensor(tensor: torch.Tensor, dst: int) -> None:
    """Send one tensor to global rank ``dst`` (blocking), from the communication device."""
    device = comm_device(None)
    dist.send(tensor if tensor.device == device else tensor.to(device), dst)


def irecv_tensor(tensor: torch.Tensor, src: int) -> Any:
    """Post a non-blocking receive into ``tensor`` (on the communication device) from global rank ``src``; the
    returned work completes when it has arrived."""
    return dist.irecv(tensor, src=src)


class Allreducer(Protocol):
    """What the exchanges between replica groups need of torchft's ``Manager``: its fault-tolerant all-reduce over
    the groups of the step's quorum (an error is reported to the manager, not raised, and the tensor is left as it
    was)."""

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = ..., reduce_op: Any = ...) -> Any: ...


def gather_rows_by_sum(manager: Allreducer, row: Sequence[int], index: int, size: int) -> list[list[int]]:
    """Every group's ``row`` of int64 values, in replica-rank order, through one all-reduce: a ``(size, len(row))``
    table in which each group fills its own row (``index``) and leaves zeros elsewhere is summed, and a value plus
    zeros is exact. A row that did not arrive (that group's all-reduce failed) reads as zeros."""
    table = torch.zeros((size, len(row)), dtype=torch.int64)
    table[index] = torch.tensor(list(row), dtype=torch.int64)
    manager.allreduce(table, reduce_op=dist.ReduceOp.SUM).wait()
    rows: list[list[int]] = table.tolist()
    return rows


def average_(manager: Allreducer, tensors: Sequence[torch.Tensor]) -> None:
    """Average ``tensors`` (gradients) in place across the groups, one all-reduce each, all posted before any is
    waited for (torchft's ``AVG``: a sum, then a division by the number of participants)."""
    works = [manager.allreduce(t, reduce_op=dist.ReduceOp.AVG) for t in tensors]
    for work in works:
        work.wait()


def average_bucket(buffer: torch.Tensor, group: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP's own reduction of one gradient bucket, as its reducer runs it without a comm hook, for the guard's comm
    hook (:mod:`.hooks.bucket`): every element multiplied by the reciprocal of the group's size, then summed over
    the group, in place; a future of the bucket. Bit for bit plain DDP, whose reducer multiplies by the reciprocal
    while it copies a gradient into its bucket (torch's ``allreduce_hook`` divides instead, which differs in the last
    bit for a group whose size is not a power of two)."""
    buffer.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])
