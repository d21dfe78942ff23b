"""The CUDA path: one fused pass of ``kernels/fingerprint/chunk_sums.cu`` (one thread block per chunk) for torch CUDA
tensors (through DLPack, on torch's current stream) and cupy arrays.

The kernel is loaded by the project's kernel loader (:mod:`sdcguard.kernels`); cupy is imported on first use. Without
cupy, torch tensors on a GPU take the torch-op path (:mod:`.tensors`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..kernels import get_kernel
from .blocks import torch_word_blocks, xp_word_blocks
from .definition import BLOCK_WORDS, CHUNK_WORDS, GPU_BLOCK_WORDS, WHOLE, weights, xp_finish

__all__ = ["KERNEL", "torch_cuda_chunk_sums", "cupy_fingerprint_device"]

KERNEL = "fingerprint/chunk_sums.cu"
"""The kernel's source, under ``kernels/``; its entry point is ``sdcguard_chunk_sums``."""
_CUDA_THREADS = 256


@functools.cache
def _cupy_weights(device: int) -> tuple[Any, Any]:
    """The weight tables on one GPU (uploaded once)."""
    import cupy

    t, u = weights()
    with cupy.cuda.Device(device):
        return cupy.asarray(t), cupy.asarray(u)


def _cupy_or_none() -> Any:
    try:
        import cupy
    except Exception:  # not installed, or a broken CUDA install: the torch-op path still works
        return None
    return cupy


@functools.cache
def _cuda_kernel(device: int) -> Any:
    return get_kernel(KERNEL, "sdcguard_chunk_sums", device)


def _cuda_sums(cupy: Any, blocks: Iterator[Any], block_words: int, nwords: int, device: int) -> tuple[Any, Any]:
    """SA and SB (cupy int32 arrays) of every chunk, from cupy word blocks, in one kernel launch per block."""
    nchunks = -(-nwords // CHUNK_WORDS)
    out_a = cupy.empty(nchunks, dtype=np.int32)
    out_b = cupy.empty(nchunks, dtype=np.int32)
    t, u = _cupy_weights(device)
    kernel = _cuda_kernel(device)
    per_block = block_words // CHUNK_WORDS
    for b, words in enumerate(blocks):
        grid = -(-int(words.size) // CHUNK_WORDS)
        c0 = b * per_block
        kernel((grid,), (_CUDA_THREADS,), (words, np.int64(words.size), t, u, out_a[c0:], out_b[c0:]))
    return out_a, out_b


def torch_cuda_chunk_sums(x: Any) -> Any:
    """``V_c`` of a CUDA tensor with the fused kernel (zero-copy through DLPack), or None without cupy."""
    cupy = _cupy_or_none()
    if cupy is None:
        return None
    import torch

    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    nwords = -(-x.numel() * x.element_size() // 4)
    blocks, views = torch_word_blocks(x, GPU_BLOCK_WORDS, WHOLE)  # a dense tensor: one launch over all of it
    block_words = WHOLE if views else GPU_BLOCK_WORDS
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream)
    with cupy.cuda.Device(device), stream:  # on torch's stream: ordered after the ops that produced x
        sa, sb = _cuda_sums(cupy, (cupy.from_dlpack(w) for w in blocks), block_words, nwords, device)
        a = torch.from_dlpack(sa).to(torch.int64) & 0xFFFFFFFF
        b = torch.from_dlpack(sb).to(torch.int64) << 32
    return a | b


def cupy_fingerprint_device(a: Any) -> Any:
    """The fingerprint of a cupy array as a 1-element uint64 array on its GPU (no host sync)."""
    import cupy

    nwords = -(-(a.size * a.itemsize) // 4)
    with a.device:  # temporaries on the array's own GPU, the fused kernel over each block
        blocks, views = xp_word_blocks(a, cupy, WHOLE)
        sa, sb = _cuda_sums(cupy, blocks, WHOLE if views else BLOCK_WORDS, nwords, int(a.device.id))
        v = sa.view(np.uint32).astype(np.uint64) | (sb.view(np.uint32).astype(np.uint64) << np.uint64(32))
        return xp_finish(v, cupy, a.size * a.itemsize)
