"""The raw bytes of an array or tensor, in logical C order, as bounded pieces and as blocks of 32-bit words.

An input whose bytes lie in order in memory is viewed in place; any other (strided, a lazy conjugate or negation)
is copied piece by piece into one staging buffer on its own device, block by block (``BLOCK_WORDS`` words, 1 MiB),
never to the host, so memory stays bounded whatever its size. numpy and cupy arrays (``xp_*``), torch tensors
(``torch_*``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .definition import BLOCK_WORDS

__all__ = ["xp_byte_pieces", "xp_word_blocks", "stage", "torch_byte_pieces", "torch_word_blocks", "resolved_bits"]

_SIGNED = {2: "int16", 4: "int32", 8: "int64"}


def resolved_bits(x: Any) -> Any:
    """``x`` as a dense tensor of its logical values, a lazy conjugate or negation applied to the sign bits with
    integer operations. ``resolve_conj`` computes: CUDA's conjugate (seen on an H200, torch 2.11) rewrites the bits
    of a NaN, so a conjugate view fingerprinted on a GPU differed from the same view on the CPU. A sign flip by
    XOR is the same bits on every device."""
    import torch

    conj, neg = x.is_conj(), x.is_neg()
    if not (conj or neg):
        return x.contiguous()
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        return x.resolve_neg().contiguous()  # integers: exact arithmetic, a negation is not a sign flip
    base = x.conj() if conj else x  # clears the lazy bit without computing
    if neg:
        base = torch._neg_view(base)
    dense = base.clone(memory_format=torch.contiguous_format)  # a copy: the XOR below must not touch x
    parts = torch.view_as_real(dense) if dense.dtype.is_complex else dense
    words = parts.view(getattr(torch, _SIGNED[parts.element_size()]))
    sign = torch.iinfo(words.dtype).min  # the sign bit alone
    if neg:
        words.bitwise_xor_(sign)
    if conj:
        words[..., 1].bitwise_xor_(sign)
    return dense


def xp_byte_pieces(a: Any, xp: Any, max_bytes: int) -> Iterator[Any]:
    """Contiguous uint8 pieces whose concatenation is ``a``'s raw bytes in logical C order (bounded copies)."""
    if a.size == 0:
        return
    if a.flags.c_contiguous:
        flat = a.reshape(-1).view(np.uint8)
        for s in range(0, flat.size, max_bytes):
            yield flat[s : s + max_bytes]
        return
    row_bytes = a.itemsize * (a.size // a.shape[0])
    if a.ndim == 1 or row_bytes <= max_bytes:
        rows = max(1, max_bytes // max(1, row_bytes)) if a.ndim > 1 else max(1, max_bytes // a.itemsize)
        for s in range(0, a.shape[0], rows):
            yield xp.ascontiguousarray(a[s : s + rows]).reshape(-1).view(np.uint8)
        return
    for i in range(a.shape[0]):
        yield from xp_byte_pieces(a[i], xp, max_bytes)


def xp_word_blocks(a: Any, xp: Any, view_words: int = BLOCK_WORDS) -> tuple[Iterator[Any], bool]:
    """int32 word blocks of ``BLOCK_WORDS`` (the last one shorter), zero-padded at the very end.

    Returns the blocks and whether they are independent views (safe to process in parallel) rather than one
    reused staging buffer.
    """
    if a.flags.c_contiguous and a.size and (a.size * a.itemsize) % 4 == 0:
        flat = a.reshape(-1).view(np.uint8)
        if _xp_ptr(flat, xp) % 4 == 0:
            words = flat.view(np.int32)
            return (words[s : s + view_words] for s in range(0, words.size, view_words)), True
    return _xp_staged_blocks(a, xp), False


def stage(pieces: Iterator[Any], staging: Any, sbytes: Any, block_bytes: int) -> Iterator[Any]:
    """Pack 1-d uint8 ``pieces`` (numpy, cupy or torch) into the int32 ``staging`` buffer (``sbytes`` is its byte
    view), yielding it each time it holds ``block_bytes``; the last, partial block is zero-padded to whole words.
    One buffer is reused, so a consumer must finish with a block before asking for the next."""
    fill = 0
    for piece in pieces:
        pos, size = 0, len(piece)
        while pos < size:
            take = min(block_bytes - fill, size - pos)
            sbytes[fill : fill + take] = piece[pos : pos + take]
            fill += take
            pos += take
            if fill == block_bytes:
                yield staging
                fill = 0
    if fill:
        nwords = (fill + 3) // 4
        sbytes[fill : nwords * 4] = 0
        yield staging[:nwords]


def _xp_staged_blocks(a: Any, xp: Any) -> Iterator[Any]:
    block_bytes = BLOCK_WORDS * 4
    staging = xp.zeros(min(BLOCK_WORDS, -(-(a.size * a.itemsize) // 4)), dtype=np.int32)  # never above the input
    sbytes = staging.view(np.uint8)
    return stage(xp_byte_pieces(a, xp, block_bytes), staging, sbytes, block_bytes)


def _xp_ptr(a: Any, xp: Any) -> int:
    return int(a.ctypes.data) if xp is np else int(a.data.ptr)


def torch_byte_pieces(x: Any, max_bytes: int) -> Iterator[Any]:
    """Contiguous uint8 pieces of ``x``'s raw bytes in logical C order; copies bounded by ``max_bytes``."""
    if x.numel() == 0:
        return
    if x.is_contiguous() and not x.is_conj() and not x.is_neg():
        flat = x.as_strided((x.numel(),), (1,)).view(__import__("torch").uint8)
        for s in range(0, flat.numel(), max_bytes):
            yield flat[s : s + max_bytes]
        return
    if x.dim() <= 1 or x.element_size() * (x.numel() // x.shape[0]) <= max_bytes:
        row_bytes = x.element_size() * (x.numel() // x.shape[0]) if x.dim() else x.element_size()
        rows = max(1, max_bytes // max(1, row_bytes))
        for s in range(0, x.shape[0] if x.dim() else 1, rows):
            piece = x[s : s + rows] if x.dim() else x
            piece = resolved_bits(piece)
            yield piece.reshape(-1).view(__import__("torch").uint8)
        return
    for i in range(x.shape[0]):
        yield from torch_byte_pieces(x[i], max_bytes)


def torch_word_blocks(
    x: Any, block_words: int = BLOCK_WORDS, view_words: int | None = None
) -> tuple[Iterator[Any], bool]:
    """int32 word blocks of ``BLOCK_WORDS`` (the last one shorter), zero-padded at the very end, and whether
    they are independent views (rather than one reused staging buffer)."""
    import torch

    if x.is_contiguous() and not x.is_conj() and not x.is_neg() and x.numel():
        flat = x.as_strided((x.numel(),), (1,)).view(torch.uint8)  # reshape keeps odd strides of size-1 dims
        if flat.numel() % 4 == 0 and flat.storage_offset() % 4 == 0:
            words = flat.view(torch.int32)
            step = view_words or block_words
            return (words[s : s + step] for s in range(0, words.numel(), step)), True
    return _torch_staged_blocks(x, block_words), False


def _torch_staged_blocks(x: Any, block_words: int) -> Iterator[Any]:
    import torch

    block_bytes = block_words * 4
    staging = torch.zeros(min(block_words, -(-x.numel() * x.element_size() // 4)), dtype=torch.int32, device=x.device)
    sbytes = staging.view(torch.uint8)
    return stage(torch_byte_pieces(x, block_bytes), staging, sbytes, block_bytes)
