"""A tiny causal transformer for guard tests and benchmarks: embedding, layernorm, softmax attention, GELU MLP,
dropout, cross-entropy. Small enough for several CPU ranks on two shared cores; every op the guard's tests
corrupt (mm/bmm, native_layer_norm, _softmax, gelu, embedding, nll_loss) appears in it.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 61


class Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(1, 2).reshape(b * h, t, d // h) for z in (q, k, v))
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = self.drop(torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1))
        y = torch.bmm(att, v).reshape(b, h, t, d // h).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyTransformer(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2, layers: int = 1, seq: int = 8, p: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy; the batch is a dict (a nested batch, as users pass them)."""
    logits = model(batch["tokens"])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["targets"].reshape(-1))


def make_batch(step: int, rank: int, *, batch: int = 4, seq: int = 8) -> dict[str, torch.Tensor]:
    """A reproducible per-(step, rank) batch of token ids."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (batch, seq + 1), generator=g)
    return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}
