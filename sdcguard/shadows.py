"""Who replays whom: peer pairing, dedicated shadow ranks, and the messages between workers and shadows.

Two modes (``SDCGuard(shadows=...)``):

- ``"peer"``: on a sampled step every data-parallel rank also replays one other rank's micro-batch. Rank ``r``
  replays the micro-batch of rank ``(r - o) mod W`` with an offset ``o`` that moves with the sample number
  (:func:`peer_offset`), so over ``W - 1`` samples every rank has checked every other. The captures travel
  point to point (one send and one receive per rank) and only on sampled steps.
- dedicated: spare ranks outside the data-parallel group (hot spares) receive, on a sampled step, one worker's
  micro-batch, random states, gradient fingerprints and parameters, asynchronously; they replay it while the
  workers go on, and send a small verdict back that the workers pick up at the first step after it arrived
  (:class:`ShadowServer` runs on the spares; :func:`plan_roles` builds the groups).

Every message is a pickled object in a ``uint8`` tensor preceded by its length; sends are non-blocking, and the
buffers are kept alive until the matching wait.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from .capture import Capture, RngHook
from .replay import Digest, LossFn, first_mismatch, replay

__all__ = [
    "Roles",
    "plan_roles",
    "peer_offset",
    "peer_source",
    "peer_target",
    "shadow_assignment",
    "digest_hash",
    "ShadowSample",
    "Verdict",
    "ShadowServer",
    "send_object",
    "recv_object",
    "exchange_objects",
]

Role = Literal["worker", "shadow"]

_STOP = -1  # length field of the message a worker sends a shadow when it closes
VERDICT_LEN = 6  # [sample, matched, first_index, loss_differs, hash_of_shadow_digest, step]


@dataclass(frozen=True, kw_only=True)
class Roles:
    """The roles of a job with dedicated shadows (see :func:`plan_roles`)."""

    workers: tuple[int, ...]
    """Global ranks of the data-parallel workers (``0 .. W-1``)."""
    shadows: tuple[int, ...]
    """Global ranks of the dedicated shadows (the last ranks)."""
    role: Role
    """This process's role."""
    dp_group: Any = field(default=None, repr=False)
    """The workers' process group (on a shadow, torch's non-member placeholder: pass it to ``SDCGuard`` all the
    same, so that no rank builds the group a second time)."""

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("a job needs at least one worker")
        if set(self.workers) & set(self.shadows):
            raise ValueError("a rank cannot be both a worker and a shadow")


def plan_roles(num_shadows: int, *, world_size: int | None = None, rank: int | None = None) -> Roles:
    """Split the world into workers (the first ranks) and ``num_shadows`` dedicated shadows (the last ranks).

    Call it on every rank right after ``init_process_group``: it creates the data-parallel group collectively.
    Pass ``roles.dp_group`` to DDP and to ``SDCGuard(group=...)``, and ``list(roles.shadows)`` as ``shadows=``.
    """
    world = world_size if world_size is not None else dist.get_world_size()
    me = rank if rank is not None else dist.get_rank()
    if not 0 <= num_shadows < world:
        raise ValueError(f"need 0 <= num_shadows < world size ({world}), got {num_shadows}")
    workers = tuple(range(world - num_shadows))
    shadows = tuple(range(world - num_shadows, world))
    group = dist.new_group(ranks=list(workers)) if dist.is_initialized() else None
    role: Role = "shadow" if me in shadows else "worker"
    return Roles(workers=workers, shadows=shadows, role=role, dp_group=group)


def peer_offset(sample: int, world: int) -> int:
    """Offset of the peer pairing for the ``sample``-th sampled step: cycles through ``1 .. W-1``."""
    if world < 2:
        return 0
    return 1 + sample % (world - 1)


def peer_source(rank: int, sample: int, world: int) -> int:
    """The rank whose micro-batch ``rank`` replays at that sample."""
    return (rank - peer_offset(sample, world)) % world


def peer_target(rank: int, sample: int, world: int) -> int:
    """The rank that replays ``rank``'s micro-batch at that sample."""
    return (rank + peer_offset(sample, world)) % world


def shadow_assignment(sample: int, num_workers: int, num_shadows: int) -> tuple[int, int]:
    """``(worker index, shadow index)`` of a sample: samples rotate over workers and over shadows."""
    return sample % num_workers, sample % num_shadows


def digest_hash(d: Digest) -> int:
    """A 63-bit summary of a digest that fits a verdict tensor (Python int hashing is not salted)."""
    return hash((d.loss, d.buckets)) & 0x7FFF_FFFF_FFFF_FFFF


# --------------------------------------------------------------------------------------------- wire helpers


def _comm_device(group: Any) -> torch.device:
    # NCCL moves CUDA tensors only; gloo (and the CPU side of mixed backends) moves CPU tensors.
    backend = dist.get_backend(group)
    if "nccl" in str(backend).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(obj: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    return torch.tensor([len(data)], dtype=torch.int64, device=device), payload


def _decode(payload: torch.Tensor) -> Any:
    return pickle.loads(payload.cpu().numpy().tobytes())


def send_object(obj: Any, dst: int, group: Any = None) -> list[Any]:
    """Send ``obj`` to global rank ``dst`` without blocking; returns the works (and buffers) to wait on later."""
    device = _comm_device(group)
    size, payload = _encode(obj, device)
    works = [dist.isend(size, dst, group=group), dist.isend(payload, dst, group=group)]
    return [works, size, payload]


def recv_object(src: int | None, group: Any = None) -> tuple[Any, int]:
    """Receive one object from global rank ``src`` (any rank with ``None``); returns ``(object, sender)``.

    A stop message (sent by :meth:`ShadowServer.stop_message`) comes back as ``(None, sender)``.
    """
    device = _comm_device(group)
    size = torch.zeros(1, dtype=torch.int64, device=device)
    sender = dist.recv(size, src=src, group=group)
    n = int(size.item())
    if n == _STOP:
        return None, sender
    payload = torch.empty(n, dtype=torch.uint8, device=device)
    dist.recv(payload, src=sender, group=group)
    return _decode(payload), sender


def exchange_objects(obj: Any, dst: int, src: int, group: Any = None) -> Any:
    """Send ``obj`` to ``dst`` and receive one object from ``src`` at the same time (a ring step: no deadlock)."""
    if dst == src == dist.get_rank():
        return obj
    device = _comm_device(group)
    size, payload = _encode(obj, device)
    their_size = torch.zeros(1, dtype=torch.int64, device=device)
    works = [dist.isend(size, dst, group=group), dist.irecv(their_size, src, group=group)]
    for w in works:
        w.wait()
    theirs = torch.empty(int(their_size.item()), dtype=torch.uint8, device=device)
    works = [dist.isend(payload, dst, group=group), dist.irecv(theirs, src, group=group)]
    for w in works:
        w.wait()
    return _decode(theirs)


# ------------------------------------------------------------------------------------------- dedicated shadow


@dataclass(frozen=True, kw_only=True)
class ShadowSample:
    """What a worker sends a dedicated shadow on a sampled step (the parameters follow as flat tensors)."""

    sample: int
    step: int
    capture: Capture
    original: Digest
    """The worker's own fingerprints of that micro-batch's loss and local gradients (with per-parameter ones)."""
    flat_layout: tuple[tuple[str, int], ...]
    """``(dtype name, element count)`` of each flat parameter tensor that follows the message."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A dedicated shadow's answer about one sample (travels as an int64 tensor of :data:`VERDICT_LEN`)."""

    sample: int
    step: int
    matched: bool
    first_index: int | None
    loss_differs: bool
    shadow_hash: int

    def to_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(
            [
                self.sample,
                int(self.matched),
                -1 if self.first_index is None else self.first_index,
                int(self.loss_differs),
                self.shadow_hash,
                self.step,
            ],
            dtype=torch.int64,
            device=device,
        )

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Verdict:
        v = [int(x) for x in t.cpu().tolist()]
        return cls(
            sample=v[0],
            matched=bool(v[1]),
            first_index=None if v[2] < 0 else v[2],
            loss_differs=bool(v[3]),
            shadow_hash=v[4],
            step=v[5],
        )


def flatten_params(params: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], tuple[tuple[str, int], ...]]:
    """Copy parameters into one flat tensor per run of equal dtype (in parameter order)."""
    flats: list[torch.Tensor] = []
    layout: list[tuple[str, int]] = []
    run: list[torch.Tensor] = []
    for p in params:
        if run and p.dtype != run[0].dtype:
            flats.append(torch.cat([t.detach().reshape(-1) for t in run]))
            run = []
        run.append(p)
    if run:
        flats.append(torch.cat([t.detach().reshape(-1) for t in run]))
    for f in flats:
        layout.append((str(f.dtype).removeprefix("torch."), f.numel()))
    return flats, tuple(layout)


def unflatten_params(flats: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flats`` shaped like ``params`` (the inverse of :func:`flatten_params`)."""
    out: list[torch.Tensor] = []
    it = iter(flats)
    flat = next(it, None)
    offset = 0
    for p in params:
        if flat is None:
            raise ValueError("parameter layout does not match: fewer values than parameters")
        if offset == flat.numel():
            flat, offset = next(it, None), 0
            if flat is None:
                raise ValueError("parameter layout does not match: fewer values than parameters")
        n = p.numel()
        out.append(flat[offset : offset + n].view(p.shape))
        offset += n
    return out


def send_sample(sample: ShadowSample, flats: Sequence[torch.Tensor], dst: int) -> list[Any]:
    """Post the asynchronous sends of one sample to a shadow; keep the result alive until the verdict is in."""
    handles = send_object(sample, dst)
    works = [dist.isend(f, dst) for f in flats]
    return [handles, works, list(flats)]


def send_stop(dst: int) -> None:
    """Tell a shadow this worker is done (blocking: called from ``close()``)."""
    device = _comm_device(None)
    dist.send(torch.tensor([_STOP], dtype=torch.int64, device=device), dst)


class ShadowServer:
    """The loop a dedicated shadow rank runs: receive a sample, replay it, send the verdict back.

    It returns once every worker has sent its stop message (``SDCGuard.close()`` on the workers).
    """

    def __init__(
        self,
        module: nn.Module,
        loss_fn: LossFn,
        params: Sequence[nn.Parameter],
        *,
        num_workers: int,
        device: torch.device,
        rng_hook: RngHook | None = None,
        on_verdict: Callable[[ShadowSample, Verdict, int], None] | None = None,
    ) -> None:
        self.module = module
        self.loss_fn = loss_fn
        self.params = list(params)
        self.num_workers = num_workers
        self.device = device
        self.rng_hook = rng_hook
        self.on_verdict = on_verdict
        self.replays = 0

    def serve(self) -> int:
        """Serve until every worker has stopped; returns the number of samples replayed."""
        stopped: set[int] = set()
        while len(stopped) < self.num_workers:
            msg, sender = recv_object(None)
            if msg is None:
                stopped.add(sender)
                continue
            sample: ShadowSample = msg
            flats = [
                torch.empty(n, dtype=getattr(torch, dtype), device=self.device) for dtype, n in sample.flat_layout
            ]
            for f in flats:
                dist.recv(f, src=sender)
            values = unflatten_params(flats, self.params)
            mine = replay(
                self.module,
                self.loss_fn,
                self.params,
                sample.capture,
                device=self.device,
                rng_hook=self.rng_hook,
                same_process=False,
                param_values=values,
                per_param=True,
            )
            mm = first_mismatch(sample.original, mine)
            verdict = Verdict(
                sample=sample.sample,
                step=sample.step,
                matched=mm is None,
                first_index=None if mm is None else mm.index,
                loss_differs=False if mm is None else mm.loss_differs,
                shadow_hash=digest_hash(mine),
            )
            dist.send(verdict.to_tensor(_comm_device(None)), sender)
            self.replays += 1
            if self.on_verdict is not None:
                self.on_verdict(sample, verdict, sender)
        return self.replays
