"""Two models whose replays are not bit-identical for software reasons (issue: nondeterminism must never be blamed
on hardware), each with a deterministic twin for the one-rank-faulty control.

- :class:`NoisyModel`: a layer adds noise drawn from a ``torch.Generator`` of its own, which the guard cannot
  capture; ``rng_hook()`` returns the hook that makes it replayable.
- :class:`ShuffledSumModel`: a custom autograd function whose backward sums the rows of the weight gradient with
  ``index_add_`` in an order that changes on every call, as GPU atomics do; ``deterministic=True`` fixes the order.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from sdcguard import RngHook
from sdcguard.testing.models import TinyTransformer, lm_loss


class NoisyModel(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = TinyTransformer(d=8, heads=2, seq=4)
        self.gen = torch.Generator().manual_seed(1234)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.body(tokens)
        return logits + 1e-2 * torch.randn(logits.shape, generator=self.gen)

    def rng_hook(self) -> RngHook:
        return RngHook(get=self.gen.get_state, set=self.gen.set_state)


class _ShuffledMatmul(torch.autograd.Function):
    """``y = x @ w``; the backward sums ``w``'s gradient row contributions in a fresh order each call."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, fixed: bool) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.fixed = fixed
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        xs, gs = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        n = xs.shape[0]
        # the order a GPU's atomics would happen to take: here the clock decides, which no captured state replays
        order = np.arange(n) if ctx.fixed else np.random.default_rng(time.perf_counter_ns()).permutation(n)
        parts = xs[order].unsqueeze(2) * gs[order].unsqueeze(1)  # one outer product per row
        return grad @ w.t(), _ordered_sum(parts), None


def _ordered_sum(parts: torch.Tensor) -> torch.Tensor:
    """Sum ``parts`` along the first dimension one row at a time (index_add_ into one row: order-dependent)."""
    out = torch.zeros(1, *parts.shape[1:], dtype=parts.dtype)
    out.index_add_(0, torch.zeros(parts.shape[0], dtype=torch.long), parts)
    return out[0]


class ShuffledSumModel(nn.Module):
    def __init__(self, seed: int = 0, deterministic: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = TinyTransformer(d=8, heads=2, seq=4)
        self.mix = nn.Parameter(torch.randn(61, 61) * 0.1)
        self.fixed = deterministic

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return _ShuffledMatmul.apply(self.body(tokens), self.mix, self.fixed)


def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return lm_loss(model, batch)
