"""A tiny mixture-of-experts model for the expert-parallel tests, the example and the benchmark: a dense input
projection, a router choosing the top ``k`` of ``experts`` experts per token, the experts (two matmuls and a GELU
each), and a dense head. With an ``ep`` mesh the experts are one ``DTensor`` per weight, sharded by expert over
``ep`` (``Shard(0)``: each EP rank holds ``experts / ep`` of them), and tokens travel to the rank holding their expert
and back by ``all_to_all_single`` (autograd's, so the backward sends their gradients back the same way): the
dispatch and combine of expert parallelism. Without a mesh every expert is local.

Deterministic: the routing is a function of the router's output (``topk``, ties by index), the dispatch keeps the
tokens in (expert, token) order, so a replay that sees the same weights and tokens routes and computes alike. An
expert may receive no token on a step (its gradient is then zero, not missing).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..fingerprints import local_tensor

__all__ = ["MoE", "moe_loss", "moe_batch", "reduce_moe_gradients"]

D, H, IN, OUT = 8, 16, 6, 4


class MoE(nn.Module):
    """See the module docstring. ``ep_mesh``: the 1-D ``ep`` sub-mesh, or None (every expert local); ``d`` and
    ``hidden``: the model's and each expert's width."""

    def __init__(self, experts: int = 4, top_k: int = 2, ep_mesh: Any = None, d: int = D, hidden: int = H) -> None:
        super().__init__()
        self.experts, self.top_k, self.ep_mesh, self.d = experts, top_k, ep_mesh, d
        self.inp = nn.Linear(IN, d)
        self.router = nn.Linear(d, experts)
        self.w1 = nn.Parameter(torch.randn(experts, d, hidden) / d**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, d) / hidden**0.5)
        self.head = nn.Linear(d, OUT)
        if ep_mesh is not None:
            from torch.distributed.tensor import Shard, distribute_tensor

            for name in ("w1", "w2"):
                full = getattr(self, name).detach()
                setattr(self, name, nn.Parameter(distribute_tensor(full, ep_mesh, [Shard(0)])))

    def _local(self, w: torch.Tensor) -> torch.Tensor:
        return w.to_local() if self.ep_mesh is not None else w  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        gates, chosen = F.softmax(self.router(h), dim=-1).topk(self.top_k, dim=-1)
        flat = chosen.reshape(-1)  # (tokens * k,) expert ids, token-major
        order = torch.argsort(flat, stable=True)  # by expert, then by token
        tokens = h.repeat_interleave(self.top_k, dim=0)[order]
        experts = flat[order]
        out = self._experts(tokens, experts)
        back = torch.empty_like(out)
        back[order] = out
        mixed = (back.reshape(-1, self.top_k, self.d) * gates.unsqueeze(-1)).sum(dim=1)
        return self.head(h + mixed)

    def _experts(self, tokens: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        w1, w2 = self._local(self.w1), self._local(self.w2)
        per = w1.shape[0]
        if self.ep_mesh is None:
            return _apply(tokens, experts, w1, w2)
        import warnings

        import torch.distributed as dist
        import torch.distributed.nn.functional as dnn

        group = self.ep_mesh.get_group()
        owner = experts // per
        send = torch.bincount(owner, minlength=dist.get_world_size(group))
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        sizes_in, sizes_out = recv.tolist(), send.tolist()
        ids = torch.empty(sum(sizes_in), dtype=experts.dtype)
        dist.all_to_all_single(ids, experts, sizes_in, sizes_out, group=group)
        with warnings.catch_warnings():  # torch 2.13 points to a private module instead: this one is public
            warnings.simplefilter("ignore", FutureWarning)
            arrived = dnn.all_to_all_single(
                torch.empty(sum(sizes_in), self.d, dtype=tokens.dtype), tokens, sizes_in, sizes_out, group=group
            )
            local = ids % per
            order = torch.argsort(local, stable=True)
            done = torch.empty_like(arrived)
            done[order] = _apply(arrived[order], local[order], w1, w2)
            return dnn.all_to_all_single(torch.empty_like(tokens), done, sizes_out, sizes_in, group=group)


def _apply(tokens: torch.Tensor, experts: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Each local expert on its tokens (``tokens`` sorted by ``experts``, local indices); none: nothing to compute."""
    counts = torch.bincount(experts, minlength=w1.shape[0]).tolist()
    parts = [F.gelu(chunk @ w1[e]) @ w2[e] for e, chunk in enumerate(torch.split(tokens, counts)) if counts[e]]
    return torch.cat(parts) if parts else tokens @ w1.new_zeros(w1.shape[1], w1.shape[1])


def moe_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def moe_batch(step: int, index: int, rows: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``index``'s micro-batch at ``step`` (``index``: its place among the ranks computing different batches)."""
    g = torch.Generator().manual_seed(1000 * step + index)
    return torch.randn(rows, IN, generator=g), torch.randint(0, OUT, (rows,), generator=g)


def reduce_moe_gradients(model: MoE, world_group: Any, dp_group: Any, world: int) -> None:
    """The job's gradient reduction by hand: dense gradients averaged over every rank (each computed a different
    batch), each expert's over the ranks holding it (its data-parallel replicas), scaled alike."""
    import torch.distributed as dist

    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        expert = name in ("w1", "w2") and model.ep_mesh is not None
        grad = local_tensor(p.grad) if expert else p.grad
        dist.all_reduce(grad, group=dp_group if expert else world_group)
        grad /= world
