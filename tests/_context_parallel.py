"""A context-parallel job for the CP tests, with the sequence split written here (torch 2.13's own
``context_parallel`` raises ``NotImplementedError`` on CPU): one causal attention block over a sequence of 12 tokens,
each ``cp`` rank holding a contiguous third or half of it, its keys and values all-gathered over the CP group
(:class:`_Gather`: the backward sums their gradients over the group and keeps its own part, a reduce-scatter written
with an all-reduce, which gloo has; torch's own autograd all-gather fails on a gloo sub-group in 2.13), the
loss on its own chunk; every weight replicated over ``dp x cp`` and its gradient averaged over them by the loop.
Faults at (rank, step): one element of a weight flipped in memory (``memory``), a fault in one rank's forward matmul,
sticky for the step (``forward``). Each rank returns what it saw per step and its parameters' fingerprints."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

V, D, SEQ, B = 11, 8, 12, 2


class CPNet(nn.Module):
    def __init__(self, cp_group: Any = None, cp_size: int = 1, cp_index: int = 0) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.head = nn.Linear(D, V)
        self.cp_group, self.cp_size, self.cp_index = cp_group, cp_size, cp_index

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.cp_group is not None:
            k = _Gather.apply(k.contiguous(), self.cp_group, self.cp_size, self.cp_index)
            v = _Gather.apply(v.contiguous(), self.cp_group, self.cp_size, self.cp_index)
        chunk = tokens.shape[1]
        rows = torch.arange(chunk).unsqueeze(1) + self.cp_index * chunk
        mask = torch.arange(k.shape[1]).unsqueeze(0) > rows  # causal over the whole sequence
        att = (q @ k.transpose(1, 2) / math.sqrt(D)).masked_fill(mask, float("-inf")).softmax(-1)
        return self.head(x + self.proj(att @ v))


class _Gather(torch.autograd.Function):
    """All-gather along the sequence (dim 1) over the CP group; backward: sum over the group, keep this rank's part."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int, index: int) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group, ctx.index, ctx.chunk = group, index, x.shape[1]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        import torch.distributed as dist

        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total[:, ctx.index * ctx.chunk : (ctx.index + 1) * ctx.chunk].contiguous(), None, None, None


def cp_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, labels = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())


def job(
    rank: int, world: int, dp: int, guarded: bool, faults: list[dict[str, Any]], steps: int, checksum_every: int = 0
) -> dict[str, Any]:
    """``faults``: ``{"kind": "memory" | "forward", "rank": r, "step": s}`` each (``forward``: sticky for the step)."""
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import sdcguard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode, corrupt_weights_

    cp = world // dp
    mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
    d, c = mesh.get_coordinate()
    torch.manual_seed(0)
    model = CPNet(mesh["cp"].get_group(), cp, c)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = None
    if guarded:
        guard = sdcguard.SDCGuard(
            model,
            cp_loss,
            mesh=mesh,
            replay_every=1,
            checksum_every=checksum_every,
            weight_check_every=1,
            escalate="off",
        )
    mode: Any = None
    for fault in faults:
        if fault["kind"] == "forward":
            sticky = Fault(pattern="bitflip", bit="exponent", timing="sticky")
            mode = OpFaultMode(sticky, ops="addmm", phase="forward", rank=fault["rank"], steps=[fault["step"]])
    seen: list[dict[str, Any]] = []
    for step in range(steps):
        for fault in faults:
            if fault["kind"] == "memory" and step == fault["step"]:
                flip = Fault(pattern="bitflip", bit=30, elements=1, seed=7)
                corrupt_weights_(model, flip, rank=fault["rank"], names="proj.weight")
        g = torch.Generator().manual_seed(100 * step + d)  # one sequence per data rank, split over its CP group
        tokens, labels = torch.randint(0, V, (B, SEQ), generator=g), torch.randint(0, V, (B, SEQ), generator=g)
        part = slice(c * SEQ // cp, (c + 1) * SEQ // cp)
        batch = (tokens[:, part], labels[:, part])
        if mode is not None:
            mode.step = step
        with mode if mode is not None else _Nothing():
            if guard is not None:
                guard.begin_step(step)
                guard.before_forward(batch)
            loss = cp_loss(model, batch)
            if guard is not None:
                guard.observe_loss(loss)
            loss.backward()
            for p in model.parameters():  # gradients over dp x cp, as torchtitan's dp_cp mesh reduces them
                dist.all_reduce(p.grad)
                p.grad /= world
            report = guard.end_step() if guard is not None else None
        commit = report is None or report.commit
        if commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None and report is not None:
            weights = guard.after_optimizer_step()
            said = [(i.kind, i.step, tuple(i.suspect_ranks)) for i in (*report.incidents, *weights)]
            words = [i.detail for i in (*report.incidents, *weights) if i.kind == "unresolved"]
            seen.append({"commit": commit, "checks": report.checks, "incidents": said, "unresolved": words})
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in model.parameters()]}


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
