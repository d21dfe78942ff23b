"""A tiny tensor-parallel job for the mesh tests: an MLP whose middle is ``ColwiseParallel`` then ``RowwiseParallel``
over the mesh's ``tp`` dimension, optionally FSDP2 over ``dp``, trained for a few steps with or without the guard,
with faults injected at (rank, step): a forward output that crosses the TP collective, one TP rank's weight gradient
only, a weight in memory. Each rank returns what it saw per step and its parameters' fingerprints."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

D, H, IN, OUT, ROWS = 16, 48, 8, 4, 6


class TPNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, D)
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.down(F.gelu(self.up(self.inp(x))))))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_batch(step: int, dp_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + dp_index)
    return torch.randn(ROWS, IN, generator=g), torch.randint(0, OUT, (ROWS,), generator=g)


class ShapeFault(TorchDispatchMode):
    """Corrupts (exponent bit flip) the output of every plain ``aten.mm`` in the backward whose shape is ``shape``,
    on ``rank`` at ``step`` (set ``.step``), ``times`` calls at most (None: every one, a sticky fault). DTensor ops
    are left to DTensor, so the corrupted op is this rank's own local matmul."""

    def __init__(self, shape: tuple[int, ...], rank: int, step: int, times: int | None) -> None:
        super().__init__()
        self.shape, self.rank, self.at, self.times = shape, rank, step, times
        self.step: int | None = None
        self.hits = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from sdcguard.fingerprints import is_dtensor_type, is_wrapper_type
        from sdcguard.inject import Fault
        from sdcguard.inject.torch_faults import corrupt_tensor_, current_rank

        if any(is_dtensor_type(t) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if any(is_wrapper_type(t) for t in types) or func.overloadpacket.__name__ != "mm":
            return out
        backward = torch._C._current_graph_task_id() != -1
        due = self.step == self.at and current_rank() == self.rank and (self.times is None or self.hits < self.times)
        if backward and due and tuple(out.shape) == self.shape:
            self.hits += 1
            corrupt_tensor_(out, Fault(pattern="bitflip", bit="exponent", timing="sticky", elements=1, seed=1))
        return out


def build(dp: int, tp: int, hsdp: bool = False) -> tuple[Any, nn.Module]:
    """The model on a ``(dp, tp)`` mesh, FSDP2 over ``dp`` when it has more than one rank; ``hsdp``: the mesh is
    ``(dp_replicate=dp // 2, dp_shard=2, tp)`` and FSDP2 shards over ``dp_shard``, replicates over ``dp_replicate``
    (HSDP; a shard group of one rank would reduce without the reduce-scatter the guard observes)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if hsdp:
        mesh = init_device_mesh("cpu", (dp // 2, 2, tp), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    else:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = TPNet()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if hsdp:
        fully_shard(model, mesh=mesh["dp_replicate", "dp_shard"])
    elif dp > 1:
        fully_shard(model, mesh=mesh["dp"])
    return mesh, model


def job(rank: int, world: int, dp: int, tp: int, guarded: bool, fault: dict[str, Any] | None, steps: int,
        options: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``fault``: ``{"kind": "forward" | "dw" | "weight", "rank": r, "step": s, "times": n | None}``; ``options``:
    the guard's keyword arguments, and ``hsdp``."""
    warnings.filterwarnings("ignore")
    from sdcguard import SDCGuard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode, corrupt_weights_

    options = dict(options)
    mesh, model = build(dp, tp, hsdp=options.pop("hsdp", False))
    coords = mesh.get_coordinate()
    dp_index = coords[0] * 2 + coords[1] if len(coords) == 3 else coords[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = {"replay_every": 1, "checksum_every": 0, "weight_check_every": 1, "escalate": "off", **options}
    guard = SDCGuard(model, loss_fn, **settings) if guarded else None
    mode: Any = None
    if fault is not None and fault["kind"] == "forward":
        timing = "sticky" if fault.get("times") is None else "transient"
        mode = OpFaultMode(Fault(pattern="bitflip", bit="exponent", timing=timing), ops="addmm", phase="forward",
                           rank=fault["rank"], steps=[fault["step"]], occurrence=1)  # fmt: skip
    elif fault is not None and fault["kind"] == "dw":
        mode = ShapeFault((D, H // tp), fault["rank"], fault["step"], fault.get("times"))
    seen: list[dict[str, Any]] = []
    for step in range(steps):
        if fault is not None and fault["kind"] == "weight" and step == fault["step"]:
            corrupt_weights_(model, Fault(pattern="bitflip", bit="exponent", elements=1), rank=fault["rank"],
                             names="norm.weight")  # fmt: skip
        batch = make_batch(step, dp_index)
        if mode is not None:
            mode.step = step
        with mode if mode is not None else _nothing():
            if guard is not None:
                report = guard.step(step, batch)
            else:
                loss_fn(model, batch).backward()
        entry: dict[str, Any] = {"step": step}
        if guard is not None:
            entry.update(commit=report.commit, checks=report.checks, run=report.matmuls_run,
                         checked=report.matmuls_checked, incidents=_said(report.incidents))  # fmt: skip
            if report.commit:
                opt.step()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None:
            entry["weights"] = _said(guard.after_optimizer_step())
        seen.append(entry)
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in model.parameters()]}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _said(incidents: Sequence[Any]) -> list[tuple[str, int, tuple[int, ...]]]:
    return [(i.kind, i.step, tuple(i.suspect_ranks)) for i in incidents]


class SPBlock(nn.Module):
    """A residual MLP block over a sequence, for SequenceParallel norms and a loss_parallel head."""

    def __init__(self, d: int = 16, h: int = 32, vocab: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.n1 = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)
        self.n2 = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        x = x + self.down(F.gelu(self.up(self.n1(x))))
        return self.head(self.n2(x))


def sp_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, labels = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())


def sequence_parallel_job(rank: int, world: int, guarded: bool, fault_step: int | None, steps: int) -> dict[str, Any]:
    """TP=2 with SequenceParallel norms, a vocabulary-parallel head and ``loss_parallel`` (torchtitan's plan for a
    block), trained with ``guard.step`` and ``train_context=loss_parallel``; a one-off fault in rank 1's forward
    matmul at ``fault_step``."""
    warnings.filterwarnings("ignore")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )  # fmt: skip

    from sdcguard import SDCGuard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = SPBlock()
    parallelize_module(model, mesh, {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "n1": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
        "n2": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = SDCGuard(model, sp_loss, replay_every=1, checksum_every=1, escalate="off", train_context=loss_parallel) \
        if guarded else None  # fmt: skip
    mode = OpFaultMode(Fault(pattern="bitflip", bit="exponent", timing="transient"), ops="addmm", phase="forward",
                       rank=1, steps=[fault_step]) if fault_step is not None else None  # fmt: skip
    seen = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        batch = (torch.randint(0, 12, (2, 8), generator=g), torch.randint(0, 12, (2, 8), generator=g))
        if mode is not None:
            mode.step = step
        with mode if mode is not None else _nothing():
            if guard is not None:
                report = guard.step(step, batch)
                seen.append((report.commit, report.checks, report.matmuls_run == report.matmuls_checked > 0,
                             _said(report.incidents)))  # fmt: skip
            else:
                with loss_parallel():
                    sp_loss(model, batch).backward()
        if guard is None or report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in model.parameters()]}
