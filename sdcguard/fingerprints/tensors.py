"""The torch path: tensors on any device; the CPU engine for CPU tensors, the fused kernel (:mod:`.cuda`) or torch
ops for GPU tensors, the result left on the device (no host synchronisation) as a 0-d int64 tensor (the uint64
reinterpreted, :func:`~.definition.signed64`).

The torch-op path (``torch_ops=True``) is the same arithmetic in torch ops: GPU tensors take it without cupy, and
the tests run it on CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ..errors import Unfingerprintable
from .blocks import torch_word_blocks
from .cpu import cpu_fingerprints
from .cuda import torch_cuda_chunk_sums
from .definition import (
    BLOCK_WORDS,
    CHUNK_WORDS,
    COMBINE_SALT,
    GPU_BLOCK_WORDS,
    MIX_C1,
    MIX_C2,
    PHI,
    SEED,
    mix_int,
    signed64,
    weights,
)

__all__ = [
    "is_torch_tensor",
    "is_wrapper_type",
    "is_dtensor_type",
    "local_tensor",
    "check_torch",
    "fingerprint_on_device",
    "fingerprints_on_device",
    "combine_on_device",
]


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_wrapper_type(kind: type) -> bool:
    """Whether tensors of type ``kind`` dispatch their own ops (``__torch_dispatch__``: a ``DTensor``, a fake or
    functional tensor): they hold no data of their own, and a dispatch mode that returns ``NotImplemented`` for them
    sees the plain ops they run instead (a rank's matmuls on its shards)."""
    import torch

    return kind is not torch.Tensor and getattr(kind, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__


def is_dtensor_type(kind: type) -> bool:
    """Whether ``kind`` is ``torch.distributed.tensor.DTensor`` (or a subclass): a dispatch mode that returns
    ``NotImplemented`` for it sees the plain ops it runs on this rank's shards instead."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and isinstance(kind, type) and issubclass(kind, dtensor)


def local_tensor(x: Any) -> Any:
    """This rank's part of a torch tensor: a ``DTensor``'s local shard (what this rank holds and computes; its
    placement and mesh coordinate say which part of the whole it is), any other tensor itself. The one place where
    sdcguard takes a rank's shard: fingerprints, hooks, checks and injectors all come through here."""
    if is_dtensor_type(type(x)):
        return x.detach().to_local()
    return x


_TORCH_WEIGHTS: dict[Any, tuple[Any, Any]] = {}


def _torch_weights(device: Any) -> tuple[Any, Any]:
    w = _TORCH_WEIGHTS.get(device)
    if w is None:
        import torch

        t, u = weights()
        w = (torch.from_numpy(t).to(device), torch.from_numpy(u).to(device))
        _TORCH_WEIGHTS[device] = w
    return w


def torch_mix(z: Any) -> Any:
    """splitmix64 finalizer on an int64 tensor: logical shifts emulated with masks (torch's >> is arithmetic)."""
    z = z ^ ((z >> 30) & ((1 << 34) - 1))
    z = z * signed64(MIX_C1)
    z = z ^ ((z >> 27) & ((1 << 37) - 1))
    z = z * signed64(MIX_C2)
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _torch_ops_chunk_sums(x: Any) -> Any:
    """``V_c`` with torch ops on the tensor's device (CUDA without cupy; also run on CPU by the tests)."""
    import torch

    t, u = _torch_weights(x.device)
    block_words = GPU_BLOCK_WORDS if x.device.type == "cuda" else BLOCK_WORDS
    nwords = -(-x.numel() * x.element_size() // 4)
    rows = min(block_words // CHUNK_WORDS, -(-nwords // CHUNK_WORDS))
    prod = torch.empty(rows, CHUNK_WORDS, dtype=torch.int32, device=x.device)
    high = torch.empty(rows, CHUNK_WORDS, dtype=torch.int32, device=x.device)
    sums = []
    for words in torch_word_blocks(x, block_words)[0]:
        k, r = divmod(words.numel(), CHUNK_WORDS)
        parts_a, parts_b = [], []
        if k:
            w = words[: k * CHUNK_WORDS].view(k, CHUNK_WORDS)
            p, h = prod[:k], high[:k]
            torch.mul(w, t, out=p)  # int32 arithmetic wraps: mod 2**32 by definition
            torch.bitwise_right_shift(w, 16, out=h)
            h.mul_(u)
            parts_a.append(p.sum(dim=1, dtype=torch.int32))
            parts_b.append(h.sum(dim=1, dtype=torch.int32))
        if r:
            w = words[k * CHUNK_WORDS :]
            parts_a.append((w * t[:r]).sum(dtype=torch.int32).reshape(1))
            parts_b.append(((w >> 16) * u[:r]).sum(dtype=torch.int32).reshape(1))
        sa = torch.cat(parts_a).to(torch.int64) & 0xFFFFFFFF
        sb = torch.cat(parts_b).to(torch.int64) << 32
        sums.append(sa | sb)
    if not sums:
        return torch.zeros(0, dtype=torch.int64, device=x.device)
    return torch.cat(sums)


def fingerprint_on_device(x: Any, *, torch_ops: bool = False) -> Any:
    """The fingerprint of one GPU tensor as a 0-d int64 tensor (the uint64 reinterpreted) on its device, with
    no host sync. CPU tensors take the CPU engine; ``torch_ops=True`` forces the torch-op path (any device),
    which CUDA tensors take without cupy."""
    import torch

    x = local_tensor(x)
    check_torch(x)
    nbytes = x.numel() * x.element_size()
    if x.device.type == "cpu" and not torch_ops:
        return torch.tensor(signed64(cpu_fingerprints([x])[0]), dtype=torch.int64)
    v = torch_cuda_chunk_sums(x) if x.device.type == "cuda" and not torch_ops else None
    if v is None:
        v = _torch_ops_chunk_sums(x)
    c = torch.arange(v.numel(), dtype=torch.int64, device=x.device)
    k = torch_mix(v + c * signed64(PHI) + signed64(SEED))
    acc = k.sum()
    return torch_mix(acc + signed64(mix_int(nbytes + PHI)))


def check_torch(x: Any) -> None:
    """Raise :class:`~sdcguard.errors.Unfingerprintable` unless the engines can read ``x``'s raw bits in place."""
    import torch

    if is_wrapper_type(type(x)):
        raise Unfingerprintable(
            f"fingerprint: a {type(x).__name__} is a tensor subclass without data of its own; fingerprint the plain "
            "tensor it wraps (a DTensor's local shard is taken by sdcguard.fingerprint itself)"
        )
    if x.layout != torch.strided:
        raise Unfingerprintable(f"fingerprint: only strided (dense) tensors are supported, got layout {x.layout}")
    if x.is_quantized:
        raise Unfingerprintable("fingerprint: quantized tensors are not supported; fingerprint x.int_repr() instead")
    if x.device.type == "meta":
        raise Unfingerprintable("fingerprint: a meta tensor has no data")


def fingerprints_on_device(xs: Sequence[Any]) -> Any:
    """Fingerprints of torch tensors as one int64 tensor on the first tensor's device (no host sync).

    Used by :class:`sdcguard.training.replica.ReplicaCheck` to all-gather fingerprints without leaving the device.
    Values are the uint64 fingerprints reinterpreted as int64.
    """
    import torch

    if not xs:
        return torch.zeros(0, dtype=torch.int64)
    xs = [local_tensor(x) for x in xs]
    for x in xs:
        check_torch(x)
    if all(x.device.type == "cpu" for x in xs):  # one batched call of the CPU engine for all of them
        return torch.tensor([signed64(v) for v in cpu_fingerprints(xs)], dtype=torch.int64)
    return torch.stack([fingerprint_on_device(x).to(xs[0].device) for x in xs])


def combine_on_device(values: Any) -> Any:
    """:func:`combine` of an int64 torch tensor of fingerprints (uint64 reinterpreted), on its device, as a 0-d
    int64 tensor (the uint64 reinterpreted): no host synchronisation."""
    import torch

    i = torch.arange(1, values.numel() + 1, dtype=torch.int64, device=values.device)
    terms = torch_mix(values.reshape(-1) + i * signed64(PHI) + signed64(COMBINE_SALT))
    return terms.sum()
