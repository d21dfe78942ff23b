"""Exact fingerprints of the raw bits of a tensor, computed on the tensor's own device.

Definition (the same on every backend; torch, numpy and cupy implement exactly this):

1. ``B`` = the raw bytes of ``x`` in logical C order (element by element, each element's bytes as stored,
   little-endian), ``n = len(B)``. A strided view therefore fingerprints like its contiguous copy. The dtype and
   shape are not part of the fingerprint: a float32 tensor and its int32 view agree.
2. Pad ``B`` with zero bytes to a multiple of 4 and read it as signed 32-bit words ``w_0 .. w_{W-1}``.
3. Cut the words into chunks of ``C = 2**14`` words (64 KiB); word ``i`` of chunk ``c`` is ``w_{cC+i}``.
4. Per chunk two 32-bit weighted sums, with fixed odd weights ``T_i``, ``U_i`` (below)::

       SA_c = sum_i  w_{cC+i}         * T_i   mod 2**32
       SB_c = sum_i (w_{cC+i} >> 16)  * U_i   mod 2**32     (>> arithmetic: the signed high half-word)

5. ``V_c = SA_c + 2**32 * SB_c``; ``A = sum_c mix(V_c + c*PHI + SEED) mod 2**64``;
   ``fingerprint = mix(A + mix(n + PHI)) mod 2**64``, an int in ``[0, 2**64)``. ``mix`` is the splitmix64
   finalizer, a bijection of 64-bit words.

Weights: ``T_i = 2*L_i + 1 + 2**(m+3) * r_i mod 2**32`` with ``m = 14``, ``L_{2p} = p``,
``L_{2p+1} = 2**(m-1) + 3p`` (distinct, all below ``2**(m+1)``) and ``r_i`` pseudo-random (splitmix64 of ``i``);
``U_i`` the same with other ``r_i``. So ``T_i`` is odd, ``v2(T_i - T_j) <= m + 1`` and
``v2(T_i + T_j) <= m + 2`` for ``i != j`` (``v2``: the number of trailing zero bits).

What is proven, for two inputs of the same byte length (a change that leaves ``V_c`` of every chunk but one
untouched, and changes that one, changes the fingerprint: the mixer is a bijection and only one term of the sum
moves):

* Any change confined to one aligned 32-bit word, in particular every single flipped bit: ``SA`` moves by
  ``d * T_i`` with ``0 < |d| < 2**32`` and ``T_i`` odd, never ``0 mod 2**32``.
* Swapping two unequal elements of 1, 2 or 4 bytes inside one chunk: if the high half-words differ, ``SB`` moves
  by ``(a - b)(U_i - U_j)`` with 2-adic valuation ``<= 15 + m + 1 < 32``; otherwise ``SA`` moves by
  ``(a - b)(T_i - T_j)`` with ``|a - b| < 2**16``, same bound. Sub-word elements: the same argument with the byte
  offset, or different offsets give valuation ``<= 23``.
* Two flipped bits inside one chunk: different bit positions move ``SA`` by ``2**a T_i +- 2**b T_j`` (valuation
  ``min(a, b) < 32``); the same position ``a`` moves ``SA`` (``a < 16``) or ``SB`` (``a >= 16``) by
  ``2**(a mod 16) (T_i +- T_j)``, valuation ``<= 15 + m + 2 = 31``.

Between inputs of different lengths only this is proven: two inputs with the same number of chunks and the same
``V_c`` in every chunk but different ``n`` differ (only ``mix(n + PHI)`` moves). In particular appending zero bytes
that stay inside the input's last chunk always changes the fingerprint (they add nothing to any sum). Other inputs
of different lengths are told apart with probability, not certainty: the 12 bytes of the uint32 words
``[0x3e342598, 0x5bbc23ed, 0xeffd214c]`` and 16 zero bytes share the fingerprint ``0x83f43075bf573200``.

What is probabilistic: inputs of different lengths (above), changes that span several chunks (whole-chunk swaps included: the chunk index enters the
mixer), several words of one element (a swap of two 8-byte elements), or many words at once are missed only if
64-bit mixed values cancel, about ``2**-64`` for unstructured changes, and only if two 32-bit sums cancel
together for changes inside one chunk.

Why two 32-bit sums and not one 64-bit sum: CPUs without AVX-512 have no vector 64-bit multiply, and 32-bit
multiply-and-sum runs at memory speed. A single linear sum modulo ``2**32`` cannot see a swap of two words that
differ only in their top bit (a float32 ``x`` and ``-x``), hence ``SB`` over the high half-words.

Implementation. CPU (numpy arrays, and torch CPU tensors read in place): a one-pass C engine
(``sdcguard/_fpcore.c``, an optional extension built at install; numpy's int32 loops compute the same values where
it is missing). An input whose bytes lie in order in memory is cut into runs of whole chunks (4 MiB); all runs of
all inputs of one call go to the engine together, shared out to a few threads when large, so a model's hundreds
of small parameters cost one call and a large buffer uses every core. The per-chunk terms of one input add up
before the final mix, so how it is cut never changes the value. A non-contiguous input (or a lazy conjugate or
negation) is copied block by block (``_BLOCK_WORDS`` words, 1 MiB) into one staging buffer on its own device,
never to the host, so memory stays bounded whatever its size. CUDA
(torch tensors through DLPack on torch's current stream, cupy arrays): one fused pass, a small cupy
``RawKernel`` (``_CUDA_SOURCE``), one thread block per chunk; without cupy, torch tensors on a GPU fall back to the
same arithmetic in torch ops (``_torch_ops_chunk_sums``, also exercised on CPU by the tests). The numpy path
never imports torch.
"""

from __future__ import annotations

import array
import functools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["fingerprint", "fingerprint_many", "fingerprints_on_device", "combine", "combine_on_device", "signed64",
           "unsigned64", "CHUNK_WORDS", "StreamingFingerprint"]

_M = 14
CHUNK_WORDS = 1 << _M
"""Words (4 bytes) per chunk: the unit inside which swaps and double flips are detected with certainty."""
_CHUNKS_PER_BLOCK = 16
_BLOCK_WORDS = CHUNK_WORDS * _CHUNKS_PER_BLOCK  # 1 MiB of input per block; temporaries: 2 x 1 MiB
_WHOLE = CHUNK_WORDS * (1 << 30)  # "one block": dense views on a GPU need no temporaries at all

_MASK64 = (1 << 64) - 1
_PHI = 0x9E3779B97F4A7C15
_SEED = 0x5D6C_9A2B_3F17_E4C1
_MIX_C1 = 0xBF58476D1CE4E5B9
_MIX_C2 = 0x94D049BB133111EB

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("sdcguard.fingerprints assumes a little-endian host")


def _mix_int(z: int) -> int:
    """splitmix64 finalizer on a Python int (the reference for the vectorized versions)."""
    z &= _MASK64
    z ^= z >> 30
    z = (z * _MIX_C1) & _MASK64
    z ^= z >> 27
    z = (z * _MIX_C2) & _MASK64
    return z ^ (z >> 31)


def signed64(v: int) -> int:
    """``v`` modulo 2**64 as a signed 64-bit integer (how a fingerprint travels in an int64 tensor)."""
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def unsigned64(v: int) -> int:
    """``v`` modulo 2**64 in ``[0, 2**64)``: a fingerprint read back from an int64 tensor (inverse of :func:`signed64`)."""
    return v & _MASK64


@functools.cache
def _weights() -> tuple[np.ndarray, np.ndarray]:
    """The fixed weight tables ``T`` and ``U`` (int32, ``CHUNK_WORDS`` each), defined in the module docstring."""
    p = np.arange(CHUNK_WORDS // 2, dtype=np.uint64)
    low = np.empty(CHUNK_WORDS, dtype=np.uint64)
    low[0::2] = p
    low[1::2] = np.uint64(1 << (_M - 1)) + np.uint64(3) * p
    idx = np.arange(CHUNK_WORDS, dtype=np.uint64)
    tables = []
    for salt in (1, 2):
        r = _mix_np(idx + np.uint64((salt * _PHI) & _MASK64))
        w = (np.uint64(2) * low + np.uint64(1) + (r << np.uint64(_M + 3))) & np.uint64(0xFFFFFFFF)
        tables.append(w.astype(np.uint32).view(np.int32))
    return tables[0], tables[1]


def _mix_np(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array of numpy or cupy (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_MIX_C1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_MIX_C2)
    return z ^ (z >> np.uint64(31))


# ----------------------------------------------------------------------------------------------------------------
# numpy / cupy
# ----------------------------------------------------------------------------------------------------------------


def _xp_byte_pieces(a: Any, xp: Any, max_bytes: int) -> Iterator[Any]:
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
        yield from _xp_byte_pieces(a[i], xp, max_bytes)


def _xp_word_blocks(a: Any, xp: Any, view_words: int = _BLOCK_WORDS) -> tuple[Iterator[Any], bool]:
    """int32 word blocks of ``_BLOCK_WORDS`` (the last one shorter), zero-padded at the very end.

    Returns the blocks and whether they are independent views (safe to process in parallel) rather than one
    reused staging buffer.
    """
    if a.flags.c_contiguous and a.size and (a.size * a.itemsize) % 4 == 0:
        flat = a.reshape(-1).view(np.uint8)
        if _xp_ptr(flat, xp) % 4 == 0:
            words = flat.view(np.int32)
            return (words[s : s + view_words] for s in range(0, words.size, view_words)), True
    return _xp_staged_blocks(a, xp), False


def _stage(pieces: Iterator[Any], staging: Any, sbytes: Any, block_bytes: int) -> Iterator[Any]:
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
    block_bytes = _BLOCK_WORDS * 4
    staging = xp.zeros(min(_BLOCK_WORDS, -(-(a.size * a.itemsize) // 4)), dtype=np.int32)  # never above the input
    sbytes = staging.view(np.uint8)
    return _stage(_xp_byte_pieces(a, xp, block_bytes), staging, sbytes, block_bytes)


def _xp_ptr(a: Any, xp: Any) -> int:
    return int(a.ctypes.data) if xp is np else int(a.data.ptr)


@functools.cache
def _cupy_weights(device: int) -> tuple[Any, Any]:
    """The weight tables on one GPU (uploaded once)."""
    import cupy

    t, u = _weights()
    with cupy.cuda.Device(device):
        return cupy.asarray(t), cupy.asarray(u)


def _xp_finish(v: Any, xp: Any, nbytes: int) -> Any:
    """The fingerprint from the chunk values ``v``, as a 1-element uint64 array on the same device."""
    return _mix_np(_xp_partial(v, 0, xp).reshape(1) + np.uint64(_mix_int(nbytes + _PHI)))


def _xp_partial(v: Any, c0: int, xp: Any) -> Any:
    """``sum_c mix(V_c + c*PHI + SEED)`` over chunk values ``v`` numbered from ``c0``: a 0-d uint64 array."""
    c = xp.arange(c0, c0 + v.size, dtype=np.uint64)
    return _mix_np(v + c * np.uint64(_PHI) + np.uint64(_SEED)).sum(dtype=np.uint64)


def _cupy_fingerprint_device(a: Any) -> Any:
    """The fingerprint of a cupy array as a 1-element uint64 array on its GPU (no host sync)."""
    import cupy

    nwords = -(-(a.size * a.itemsize) // 4)
    with a.device:  # temporaries on the array's own GPU, the fused kernel over each block
        blocks, views = _xp_word_blocks(a, cupy, _WHOLE)
        sa, sb = _cuda_sums(cupy, blocks, _WHOLE if views else _BLOCK_WORDS, nwords, int(a.device.id))
        v = sa.view(np.uint32).astype(np.uint64) | (sb.view(np.uint32).astype(np.uint64) << np.uint64(32))
        return _xp_finish(v, cupy, a.size * a.itemsize)


# ----------------------------------------------------------------------------------------------------------------
# CPU: numpy arrays and torch CPU tensors (zero-copy numpy views of the same memory)
# ----------------------------------------------------------------------------------------------------------------

try:  # the C engine (one pass, GIL released, many inputs per call); optional, numpy computes the same values
    from . import _fpcore
except ImportError:  # pragma: no cover - built by the package's own install; a compiler-less install lacks it
    _fpcore = None

_USE_C = os.environ.get("SDCGUARD_FINGERPRINT_NUMPY") != "1"
"""``SDCGUARD_FINGERPRINT_NUMPY=1`` forces the numpy loops (the tests compare both paths)."""

_RUN_BYTES = 4 << 20
"""Dense inputs are cut into runs of whole chunks of at most this many bytes, which threads share out."""
_POOL_MIN_BYTES = 8 << 20
"""Below this much data in one call, handing work to threads costs more than it saves."""
_POOL: Any = None


def _pool_workers() -> int:
    """Threads for one call: the cores we may use, capped by torch's intra-op threads when torch is loaded (a
    training rank pinned to one thread must not get more from us), and by 4."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        cpus = min(cpus, torch.get_num_threads())
    return max(1, min(4, cpus))


def _cpu_span(x: Any) -> tuple[int, int] | None:
    """``(address, nbytes)`` of a CPU array's or tensor's raw bytes when they lie in logical C order in its own
    memory; None when they must be copied first (not C-contiguous, or a lazy conjugate or negation)."""
    if isinstance(x, np.ndarray):
        return (x.__array_interface__["data"][0], x.nbytes) if x.flags.c_contiguous else None
    if not x.is_contiguous() or x.is_conj() or x.is_neg():
        return None
    return x.data_ptr(), x.numel() * x.element_size()


def _np_block_sums(words: np.ndarray, t: np.ndarray, u: np.ndarray, prod: np.ndarray, high: np.ndarray,
                   out_a: np.ndarray, out_b: np.ndarray) -> None:
    """``SA``/``SB`` of the chunks of one block of words (starting on a chunk boundary) with numpy's loops;
    ``prod`` and ``high`` are flat int32 temporaries at least as long as ``words``."""
    k, r = divmod(words.size, CHUNK_WORDS)
    if k:
        w = words[: k * CHUNK_WORDS].reshape(k, CHUNK_WORDS)
        p, h = prod[: k * CHUNK_WORDS].reshape(k, CHUNK_WORDS), high[: k * CHUNK_WORDS].reshape(k, CHUNK_WORDS)
        np.multiply(w, t, out=p)  # int32 arithmetic wraps: mod 2**32 by definition
        np.right_shift(w, 16, out=h)  # arithmetic shift: the signed high half-word
        np.multiply(h, u, out=h)
        p.sum(axis=1, dtype=np.int32, out=out_a[:k])
        h.sum(axis=1, dtype=np.int32, out=out_b[:k])
    if r:
        w = words[k * CHUNK_WORDS :]
        p, h = prod[k * CHUNK_WORDS : k * CHUNK_WORDS + r], high[k * CHUNK_WORDS : k * CHUNK_WORDS + r]
        np.multiply(w, t[:r], out=p)
        np.right_shift(w, 16, out=h)
        np.multiply(h, u[:r], out=h)
        out_a[k] = p.sum(dtype=np.int32)
        out_b[k] = h.sum(dtype=np.int32)


def _np_partial(address: int, nbytes: int, c0: int) -> int:
    """What ``_fpcore.partials`` computes for one run, with numpy's loops (temporaries of at most one block)."""
    if not nbytes:
        return 0
    import ctypes

    b = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=np.uint8)
    if nbytes % 4:  # only the last run of an input: a copy no bigger than the run, zero-padded
        words = np.zeros(-(-nbytes // 4), dtype=np.int32)
        words.view(np.uint8)[:nbytes] = b
    else:
        words = b.view(np.int32)
    t, u = _weights()
    nchunks = -(-words.size // CHUNK_WORDS)
    out_a = np.empty(nchunks, dtype=np.int32)
    out_b = np.empty(nchunks, dtype=np.int32)
    prod = np.empty(min(words.size, _BLOCK_WORDS), dtype=np.int32)
    high = np.empty_like(prod)
    for s in range(0, words.size, _BLOCK_WORDS):
        c = s // CHUNK_WORDS
        _np_block_sums(words[s : s + _BLOCK_WORDS], t, u, prod, high, out_a[c:], out_b[c:])
    v = out_a.view(np.uint32).astype(np.uint64) | (out_b.view(np.uint32).astype(np.uint64) << np.uint64(32))
    return int(_xp_partial(v, c0, np))


def _cpu_partials(runs: list[int]) -> list[int]:
    """For each run (flat ``address, nbytes, first chunk index`` triples): the sum of its chunks' mixed terms.
    The memory must stay alive during the call (the caller holds the arrays and tensors)."""
    if _fpcore is not None and _USE_C and runs:
        t, u = _weights()
        return _fpcore.partials(array.array("Q", runs), t, u, CHUNK_WORDS)  # type: ignore[no-any-return]
    return [_np_partial(*runs[k : k + 3]) for k in range(0, len(runs), 3)]


def _cpu_run_partials(runs: list[int]) -> list[int]:
    """``_cpu_partials`` of all runs, shared out to a few threads (contiguous groups of about equal bytes) when
    there is enough data: the C engine and numpy's loops both release the GIL, like torch's own reductions."""
    global _POOL
    total = sum(runs[1::3])
    workers = _pool_workers()
    if workers == 1 or len(runs) < 6 or total < _POOL_MIN_BYTES:
        return _cpu_partials(runs)
    groups: list[list[int]] = [[] for _ in range(workers)]
    start = 0
    for k in range(0, len(runs), 3):
        groups[min(workers - 1, start * workers // total)] += runs[k : k + 3]
        start += runs[k + 1]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(4, thread_name_prefix="sdcguard-fingerprint")
    return [p for part in _POOL.map(_cpu_partials, [g for g in groups if g]) for p in part]


def _cpu_staged_partial(x: Any, nbytes: int) -> int:
    """The summed chunk terms of an input whose bytes must be copied: packed block by block into one staging
    buffer (at most one block, never more than the input), on this thread."""
    block_bytes = _BLOCK_WORDS * 4
    if isinstance(x, np.ndarray):
        pieces: Iterator[Any] = _xp_byte_pieces(x, np, block_bytes)
    else:
        pieces = (p.numpy() for p in _torch_byte_pieces(x, block_bytes))
    staging = np.zeros(min(_BLOCK_WORDS, -(-nbytes // 4)), dtype=np.int32)
    address = staging.__array_interface__["data"][0]
    blocks = _stage(pieces, staging, staging.view(np.uint8), block_bytes)
    return sum(_cpu_partials([address, w.nbytes, b * _CHUNKS_PER_BLOCK])[0] for b, w in enumerate(blocks))


def _cpu_fingerprints(xs: Sequence[Any]) -> list[int]:
    """Fingerprints of numpy arrays and CPU torch tensors (which the caller keeps alive).

    Every input whose bytes lie in order in memory is cut into runs of whole chunks; all runs of all inputs go to
    the engine in one call (a few, on threads, when large), so a model's hundreds of small parameters cost one
    call. Inputs whose bytes need copying are staged one block at a time. The runs of one input add up
    (mod 2**64) before the final mix.
    """
    acc = [0] * len(xs)
    sizes: list[int] = []
    runs: list[int] = []
    owners: list[int] = []
    for k, x in enumerate(xs):
        span = _cpu_span(x)
        if span is None:
            if not isinstance(x, np.ndarray):
                x = x.detach()  # a parameter that requires grad: the same memory
            nbytes = x.nbytes if isinstance(x, np.ndarray) else x.numel() * x.element_size()
            acc[k] = _cpu_staged_partial(x, nbytes)
            sizes.append(nbytes)
            continue
        address, nbytes = span
        sizes.append(nbytes)
        for s in range(0, nbytes, _RUN_BYTES):
            runs += (address + s, min(_RUN_BYTES, nbytes - s), s // (4 * CHUNK_WORDS))
            owners.append(k)
    for k, p in zip(owners, _cpu_run_partials(runs)):
        acc[k] += p
    return [_mix_int(a + _mix_int(n + _PHI)) for a, n in zip(acc, sizes)]


# ----------------------------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------------------------


def _is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_byte_pieces(x: Any, max_bytes: int) -> Iterator[Any]:
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
            piece = piece.resolve_conj().resolve_neg().contiguous()
            yield piece.reshape(-1).view(__import__("torch").uint8)
        return
    for i in range(x.shape[0]):
        yield from _torch_byte_pieces(x[i], max_bytes)


def _torch_word_blocks(
    x: Any, block_words: int = _BLOCK_WORDS, view_words: int | None = None
) -> tuple[Iterator[Any], bool]:
    """int32 word blocks of ``_BLOCK_WORDS`` (the last one shorter), zero-padded at the very end, and whether
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
    return _stage(_torch_byte_pieces(x, block_bytes), staging, sbytes, block_bytes)


_TORCH_WEIGHTS: dict[Any, tuple[Any, Any]] = {}
_GPU_BLOCK_WORDS = CHUNK_WORDS * 1024  # 64 MiB blocks on a GPU: fewer, larger kernels (launches dominate small ones)


def _torch_weights(device: Any) -> tuple[Any, Any]:
    w = _TORCH_WEIGHTS.get(device)
    if w is None:
        import torch

        t, u = _weights()
        w = (torch.from_numpy(t).to(device), torch.from_numpy(u).to(device))
        _TORCH_WEIGHTS[device] = w
    return w


def _torch_mix(z: Any) -> Any:
    """splitmix64 finalizer on an int64 tensor: logical shifts emulated with masks (torch's >> is arithmetic)."""
    z = z ^ ((z >> 30) & ((1 << 34) - 1))
    z = z * signed64(_MIX_C1)
    z = z ^ ((z >> 27) & ((1 << 37) - 1))
    z = z * signed64(_MIX_C2)
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _torch_ops_chunk_sums(x: Any) -> Any:
    """``V_c`` with torch ops on the tensor's device (CUDA without cupy; also run on CPU by the tests)."""
    import torch

    t, u = _torch_weights(x.device)
    block_words = _GPU_BLOCK_WORDS if x.device.type == "cuda" else _BLOCK_WORDS
    nwords = -(-x.numel() * x.element_size() // 4)
    rows = min(block_words // CHUNK_WORDS, -(-nwords // CHUNK_WORDS))
    prod = torch.empty(rows, CHUNK_WORDS, dtype=torch.int32, device=x.device)
    high = torch.empty(rows, CHUNK_WORDS, dtype=torch.int32, device=x.device)
    sums = []
    for words in _torch_word_blocks(x, block_words)[0]:
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


def _torch_fingerprint_device(x: Any, *, torch_ops: bool = False) -> Any:
    """The fingerprint of one GPU tensor as a 0-d int64 tensor (the uint64 reinterpreted) on its device, with
    no host sync. CPU tensors take the CPU engine; ``torch_ops=True`` forces the torch-op path (any device),
    which CUDA tensors take without cupy."""
    import torch

    _check_torch(x)
    nbytes = x.numel() * x.element_size()
    if x.device.type == "cpu" and not torch_ops:
        return torch.tensor(signed64(_cpu_fingerprints([x])[0]), dtype=torch.int64)
    v = _torch_cuda_chunk_sums(x) if x.device.type == "cuda" and not torch_ops else None
    if v is None:
        v = _torch_ops_chunk_sums(x)
    c = torch.arange(v.numel(), dtype=torch.int64, device=x.device)
    k = _torch_mix(v + c * signed64(_PHI) + signed64(_SEED))
    acc = k.sum()
    return _torch_mix(acc + signed64(_mix_int(nbytes + _PHI)))


def _check_torch(x: Any) -> None:
    if x.layout != __import__("torch").strided:
        raise TypeError(f"fingerprint: only strided (dense) tensors are supported, got layout {x.layout}")
    if x.is_quantized:
        raise TypeError("fingerprint: quantized tensors are not supported; fingerprint x.int_repr() instead")
    if x.device.type == "meta":
        raise TypeError("fingerprint: a meta tensor has no data")


def fingerprints_on_device(xs: Sequence[Any]) -> Any:
    """Fingerprints of torch tensors as one int64 tensor on the first tensor's device (no host sync).

    Used by :class:`sdcguard.replica.ReplicaCheck` to all-gather fingerprints without leaving the device. Values
    are the uint64 fingerprints reinterpreted as int64.
    """
    import torch

    if not xs:
        return torch.zeros(0, dtype=torch.int64)
    for x in xs:
        _check_torch(x)
    if all(x.device.type == "cpu" for x in xs):  # one batched call of the CPU engine for all of them
        return torch.tensor([signed64(v) for v in _cpu_fingerprints(xs)], dtype=torch.int64)
    return torch.stack([_torch_fingerprint_device(x).to(xs[0].device) for x in xs])


# ----------------------------------------------------------------------------------------------------------------
# CUDA: one fused pass (a small cupy RawKernel) for torch CUDA tensors and cupy arrays
# ----------------------------------------------------------------------------------------------------------------

# One thread block per chunk: each thread multiplies-and-adds a strided share of the chunk's words (uint4 loads),
# then a warp-shuffle reduction. Unsigned 32-bit arithmetic wraps mod 2**32, as the definition says; the signed
# right shift is arithmetic in CUDA C++. The weight tables (2 x 64 KiB) stay in L2, so the data is read once.
_CUDA_SOURCE = r"""
#define CHUNK 16384
extern "C" __global__ void sdcguard_chunk_sums(
    const unsigned int* __restrict__ words, long long nwords,
    const unsigned int* __restrict__ T, const unsigned int* __restrict__ U,
    unsigned int* __restrict__ out_a, unsigned int* __restrict__ out_b)
{
    long long base = (long long)blockIdx.x * CHUNK;
    long long left = nwords - base;
    int n = left < CHUNK ? (int)left : CHUNK;
    unsigned int a = 0u, b = 0u;
    const unsigned int* w = words + base;
    if (n == CHUNK && (((unsigned long long)w) & 15ull) == 0ull) {
        const uint4* w4 = (const uint4*)w;
        const uint4* t4 = (const uint4*)T;
        const uint4* u4 = (const uint4*)U;
        for (int i = threadIdx.x; i < CHUNK / 4; i += blockDim.x) {
            uint4 x = w4[i];
            uint4 t = __ldg(t4 + i);
            uint4 u = __ldg(u4 + i);
            a += x.x * t.x + x.y * t.y + x.z * t.z + x.w * t.w;
            b += (unsigned int)(((int)x.x) >> 16) * u.x + (unsigned int)(((int)x.y) >> 16) * u.y
               + (unsigned int)(((int)x.z) >> 16) * u.z + (unsigned int)(((int)x.w) >> 16) * u.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            unsigned int x = w[i];
            a += x * T[i];
            b += (unsigned int)(((int)x) >> 16) * U[i];
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, off);
        b += __shfl_down_sync(0xffffffffu, b, off);
    }
    __shared__ unsigned int sa[32], sb[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sa[warp] = a; sb[warp] = b; }
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        a = lane < nwarps ? sa[lane] : 0u;
        b = lane < nwarps ? sb[lane] : 0u;
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, off);
            b += __shfl_down_sync(0xffffffffu, b, off);
        }
        if (lane == 0) { out_a[blockIdx.x] = a; out_b[blockIdx.x] = b; }
    }
}
"""
_CUDA_THREADS = 256
_CUDA_KERNELS: dict[int, Any] = {}


def _cupy_or_none() -> Any:
    try:
        import cupy
    except Exception:  # not installed, or a broken CUDA install: the torch-op path still works
        return None
    return cupy


def _cuda_kernel(cupy: Any, device: int) -> Any:
    kernel = _CUDA_KERNELS.get(device)
    if kernel is None:
        with cupy.cuda.Device(device):
            kernel = cupy.RawModule(code=_CUDA_SOURCE).get_function("sdcguard_chunk_sums")
        _CUDA_KERNELS[device] = kernel
    return kernel


def _cuda_sums(cupy: Any, blocks: Iterator[Any], block_words: int, nwords: int, device: int) -> tuple[Any, Any]:
    """SA and SB (cupy int32 arrays) of every chunk, from cupy word blocks, in one kernel launch per block."""
    nchunks = -(-nwords // CHUNK_WORDS)
    out_a = cupy.empty(nchunks, dtype=np.int32)
    out_b = cupy.empty(nchunks, dtype=np.int32)
    t, u = _cupy_weights(device)
    kernel = _cuda_kernel(cupy, device)
    per_block = block_words // CHUNK_WORDS
    for b, words in enumerate(blocks):
        grid = -(-int(words.size) // CHUNK_WORDS)
        c0 = b * per_block
        kernel((grid,), (_CUDA_THREADS,), (words, np.int64(words.size), t, u, out_a[c0:], out_b[c0:]))
    return out_a, out_b


def _torch_cuda_chunk_sums(x: Any) -> Any:
    """``V_c`` of a CUDA tensor with the fused kernel (zero-copy through DLPack), or None without cupy."""
    cupy = _cupy_or_none()
    if cupy is None:
        return None
    import torch

    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    nwords = -(-x.numel() * x.element_size() // 4)
    blocks, views = _torch_word_blocks(x, _GPU_BLOCK_WORDS, _WHOLE)  # a dense tensor: one launch over all of it
    block_words = _WHOLE if views else _GPU_BLOCK_WORDS
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream)
    with cupy.cuda.Device(device), stream:  # on torch's stream: ordered after the ops that produced x
        sa, sb = _cuda_sums(cupy, (cupy.from_dlpack(w) for w in blocks), block_words, nwords, device)
        a = torch.from_dlpack(sa).to(torch.int64) & 0xFFFFFFFF
        b = torch.from_dlpack(sb).to(torch.int64) << 32
    return a | b


# ----------------------------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------------------------


def fingerprint(x: Any) -> int:
    """Exact fingerprint (an int in ``[0, 2**64)``) of the raw bits of a torch tensor, numpy or cupy array.

    Computed on the data's own device; the same bits give the same value on every backend. See the module
    docstring for the definition and what is guaranteed.
    """
    return fingerprint_many([x])[0]


def fingerprint_many(xs: Sequence[Any]) -> list[int]:
    """Fingerprints of many tensors/arrays with one host synchronisation per device (not one per tensor)."""
    results: list[int | None] = [None] * len(xs)
    cpu: list[tuple[int, Any]] = []  # numpy arrays and CPU torch tensors: one batched call of the CPU engine
    pending: dict[Any, list[tuple[int, Any]]] = {}  # GPU: fingerprints left on their device until one sync
    for i, x in enumerate(xs):
        if isinstance(x, np.generic):  # a numpy scalar: its bytes, as a 0-d array
            x = np.asarray(x)
        if isinstance(x, np.ndarray):
            _check_np(x)
            cpu.append((i, x))
        elif _is_torch_tensor(x):
            _check_torch(x)
            if x.device.type == "cpu":
                cpu.append((i, x))
            else:
                pending.setdefault(("torch", x.device), []).append((i, _torch_fingerprint_device(x)))
        elif type(x).__module__.startswith("cupy"):
            _check_np(x)
            pending.setdefault(("cupy", int(x.device.id)), []).append((i, _cupy_fingerprint_device(x)))
        else:
            raise TypeError(f"fingerprint: expected a torch tensor, numpy or cupy array, got {type(x).__name__}")
    for (i, _), v in zip(cpu, _cpu_fingerprints([x for _, x in cpu])):
        results[i] = v
    for (kind, _), items in pending.items():
        if kind == "torch":
            import torch

            values = torch.stack([v for _, v in items]).tolist()  # the one host sync for this device
            for (i, _), v in zip(items, values):
                results[i] = unsigned64(v)
        else:
            import cupy

            values = cupy.concatenate([v for _, v in items]).get().tolist()
            for (i, _), v in zip(items, values):
                results[i] = int(v)
    return [int(r) for r in results]  # type: ignore[arg-type]


class StreamingFingerprint:
    """The fingerprint of bytes that arrive in pieces (a file read in order), on the CPU engine: ``update`` with
    each piece (any sizes), then ``value``; equal to :func:`fingerprint` of the pieces joined. Whole chunks are
    summed where the piece lies; only a chunk split between two pieces is copied (at most one chunk)."""

    _CHUNK_BYTES = 4 * CHUNK_WORDS

    def __init__(self) -> None:
        self._acc = 0
        self._n = 0
        self._carry = np.zeros(self._CHUNK_BYTES, dtype=np.uint8)
        self._held = 0

    def update(self, data: Any) -> None:
        """Fold in the next piece (a bytes-like object)."""
        piece = np.frombuffer(data, dtype=np.uint8)
        if not piece.size:
            return
        start = 0
        if self._held:  # complete the chunk the previous piece left open
            take = min(self._CHUNK_BYTES - self._held, piece.size)
            self._carry[self._held:self._held + take] = piece[:take]
            self._held += take
            start = take
            if self._held < self._CHUNK_BYTES:
                return
            self._fold(self._carry, self._CHUNK_BYTES)
            self._held = 0
        whole = (piece.size - start) // self._CHUNK_BYTES * self._CHUNK_BYTES
        if whole:
            self._fold(piece[start:start + whole], whole)
        rest = piece.size - start - whole
        if rest:
            self._carry[:rest] = piece[start + whole:]
            self._held = rest

    def _fold(self, words: Any, nbytes: int) -> None:
        address = words.__array_interface__["data"][0]
        runs: list[int] = []
        for s in range(0, nbytes, _RUN_BYTES):
            runs += (address + s, min(_RUN_BYTES, nbytes - s), (self._n + s) // self._CHUNK_BYTES)
        self._acc += sum(_cpu_partials(runs))
        self._n += nbytes

    @property
    def value(self) -> int:
        """The fingerprint of every byte so far (the bytes folded in stay as they are: more may follow)."""
        acc, n = self._acc, self._n
        if self._held:
            address = self._carry.__array_interface__["data"][0]
            acc += _cpu_partials([address, self._held, n // self._CHUNK_BYTES])[0]
            n += self._held
        return _mix_int(acc + _mix_int(n + _PHI)) & _MASK64

    @property
    def nbytes(self) -> int:
        """Bytes folded in so far."""
        return self._n + self._held


_COMBINE_SALT = 0x2545_F491_4F6C_DD1D


def combine(values: Sequence[int]) -> int:
    """One 64-bit value standing for a sequence of fingerprints: ``sum_i mix(v_i + (i + 1) * PHI + SALT)``
    modulo ``2**64``.

    Proven, for two sequences of the same length: changing any single ``v_i`` changes the result (``mix`` is a
    bijection and only term ``i`` moves), so a combination of per-tensor fingerprints inherits their single-bit-flip
    guarantee. Probabilistic: changes to several values at once are missed only if the moved mixed terms cancel
    (about ``2**-64``); the position enters each term, so swapping two unequal values is seen like any other
    two-value change, not with certainty; sequences of different lengths are not separated with certainty either.
    """
    acc = 0
    for i, v in enumerate(values):
        acc += _mix_int((v & _MASK64) + (i + 1) * _PHI + _COMBINE_SALT)
    return acc & _MASK64


def combine_on_device(values: Any) -> Any:
    """:func:`combine` of an int64 torch tensor of fingerprints (uint64 reinterpreted), on its device, as a 0-d
    int64 tensor (the uint64 reinterpreted): no host synchronisation."""
    import torch

    i = torch.arange(1, values.numel() + 1, dtype=torch.int64, device=values.device)
    terms = _torch_mix(values.reshape(-1) + i * signed64(_PHI) + signed64(_COMBINE_SALT))
    return terms.sum()


def _check_np(a: Any) -> None:
    if a.dtype.hasobject:
        raise TypeError("fingerprint: object arrays hold pointers, not data; convert to a numeric dtype first")
