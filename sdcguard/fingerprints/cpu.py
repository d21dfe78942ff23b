"""The CPU path: numpy arrays and torch CPU tensors, read in place, with the C engine or numpy's loops.

A one-pass C engine (``sdcguard/_fpcore.c``, an optional extension built at install; numpy's int32 loops compute the
same values where it is missing), which can also copy what it reads (:func:`cpu_copy_fingerprints`: a staging copy
and its fingerprints in one pass). An input whose bytes lie in order in memory is cut into runs of whole chunks
(4 MiB); all runs of all inputs of one call go to the engine together, shared out to a few threads when large, so a
model's hundreds of small parameters cost one call and a large buffer uses every core. The per-chunk terms of one
input add up before the final mix, so how it is cut never changes the value. Inputs whose bytes need copying are
staged one block at a time (:mod:`.blocks`). The numpy path never imports torch.
"""

from __future__ import annotations

import array
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .blocks import resolved_bits, stage, torch_byte_pieces, xp_byte_pieces
from .definition import BLOCK_WORDS, CHUNK_WORDS, CHUNKS_PER_BLOCK, MASK64, PHI, mix_int, weights, xp_partial

__all__ = [
    "cpu_fingerprints",
    "cpu_copy_fingerprints",
    "cpu_partials",
    "cpu_copy_partials",
    "StreamingFingerprint",
    "RUN_BYTES",
    "c_engine_built",
    "numpy_loops",
]

try:  # the C engine (one pass, GIL released, many inputs per call); optional, numpy computes the same values
    from .. import _fpcore
except ImportError:  # pragma: no cover - built by the package's own install; a compiler-less install lacks it
    _fpcore = None

_USE_C = os.environ.get("SDCGUARD_FINGERPRINT_NUMPY") != "1"
"""``SDCGUARD_FINGERPRINT_NUMPY=1`` forces the numpy loops (the tests compare both paths)."""


def c_engine_built() -> bool:
    """Whether the C engine (``sdcguard._fpcore``) was built at install (without a compiler it was not)."""
    return _fpcore is not None


@contextmanager
def numpy_loops() -> Iterator[None]:
    """Within the block, compute with numpy's loops even where the C engine is built (the tests compare the two)."""
    global _USE_C
    saved, _USE_C = _USE_C, False
    try:
        yield
    finally:
        _USE_C = saved


RUN_BYTES = 4 << 20
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


def _host_bytes(address: int, nbytes: int) -> np.ndarray:
    """The ``nbytes`` bytes of host memory at ``address`` as a uint8 array (no copy; the caller keeps them alive)."""
    import ctypes

    # A ctypes array exports the buffer protocol; numpy's stubs accept only bytes-like types and memoryview.
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=np.uint8)  # type: ignore[call-overload]


def _nbytes(x: Any) -> int:
    """Bytes of a numpy array's or torch tensor's elements."""
    return int(x.nbytes) if isinstance(x, np.ndarray) else x.numel() * x.element_size()


def _np_block_sums(
    words: np.ndarray,
    t: np.ndarray,
    u: np.ndarray,
    prod: np.ndarray,
    high: np.ndarray,
    out_a: np.ndarray,
    out_b: np.ndarray,
) -> None:
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
    b = _host_bytes(address, nbytes)
    if nbytes % 4:  # only the last run of an input: a copy no bigger than the run, zero-padded
        words = np.zeros(-(-nbytes // 4), dtype=np.int32)
        words.view(np.uint8)[:nbytes] = b
    else:
        words = b.view(np.int32)
    t, u = weights()
    nchunks = -(-words.size // CHUNK_WORDS)
    out_a = np.empty(nchunks, dtype=np.int32)
    out_b = np.empty(nchunks, dtype=np.int32)
    prod = np.empty(min(words.size, BLOCK_WORDS), dtype=np.int32)
    high = np.empty_like(prod)
    for s in range(0, words.size, BLOCK_WORDS):
        c = s // CHUNK_WORDS
        _np_block_sums(words[s : s + BLOCK_WORDS], t, u, prod, high, out_a[c:], out_b[c:])
    v = out_a.view(np.uint32).astype(np.uint64) | (out_b.view(np.uint32).astype(np.uint64) << np.uint64(32))
    return int(xp_partial(v, c0, np))


def cpu_partials(runs: list[int]) -> list[int]:
    """For each run (flat ``address, nbytes, first chunk index`` triples): the sum of its chunks' mixed terms.
    The memory must stay alive during the call (the caller holds the arrays and tensors)."""
    if _fpcore is not None and _USE_C and runs:
        t, u = weights()
        return _fpcore.partials(array.array("Q", runs), t, u, CHUNK_WORDS)
    return [_np_partial(*runs[k : k + 3]) for k in range(0, len(runs), 3)]


def cpu_copy_partials(runs: list[int]) -> list[int]:
    """For each run (flat ``source, destination, nbytes, first chunk index`` quadruples): copies the source's bytes
    to the destination and returns what :func:`cpu_partials` returns for the source, in one pass with the C engine
    (each word loaded once, summed and stored), with numpy's loops in two (copy, then the source's sums)."""
    if _fpcore is not None and _USE_C and runs:
        t, u = weights()
        return _fpcore.copy_partials(array.array("Q", runs), t, u, CHUNK_WORDS)
    import ctypes

    out = []
    for k in range(0, len(runs), 4):
        src, dst, nbytes, c0 = runs[k : k + 4]
        ctypes.memmove(dst, src, nbytes)
        out.append(_np_partial(src, nbytes, c0))
    return out


def _cpu_run_partials(runs: list[int], width: int = 3) -> list[int]:
    """:func:`cpu_partials` (``width`` 3) or :func:`cpu_copy_partials` (``width`` 4) of all runs, shared out to a
    few threads (contiguous groups of about equal bytes) when there is enough data: the C engine and numpy's loops
    both release the GIL, like torch's own reductions."""
    global _POOL
    engine = cpu_partials if width == 3 else cpu_copy_partials
    total = sum(runs[width - 2 :: width])
    workers = _pool_workers()
    if workers == 1 or len(runs) < 2 * width or total < _POOL_MIN_BYTES:
        return engine(runs)
    groups: list[list[int]] = [[] for _ in range(workers)]
    start = 0
    for k in range(0, len(runs), width):
        groups[min(workers - 1, start * workers // total)] += runs[k : k + width]
        start += runs[k + width - 2]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(4, thread_name_prefix="sdcguard-fingerprint")
    return [p for part in _POOL.map(engine, [g for g in groups if g]) for p in part]


def _cpu_staged_partial(x: Any, nbytes: int) -> int:
    """The summed chunk terms of an input whose bytes must be copied: packed block by block into one staging
    buffer (at most one block, never more than the input), on this thread."""
    block_bytes = BLOCK_WORDS * 4
    if isinstance(x, np.ndarray):
        pieces: Iterator[Any] = xp_byte_pieces(x, np, block_bytes)
    else:
        pieces = (p.numpy() for p in torch_byte_pieces(x, block_bytes))
    staging = np.zeros(min(BLOCK_WORDS, -(-nbytes // 4)), dtype=np.int32)
    address = staging.__array_interface__["data"][0]
    blocks = stage(pieces, staging, staging.view(np.uint8), block_bytes)
    return sum(cpu_partials([address, w.nbytes, b * CHUNKS_PER_BLOCK])[0] for b, w in enumerate(blocks))


def cpu_fingerprints(xs: Sequence[Any]) -> list[int]:
    """Fingerprints of numpy arrays and CPU torch tensors (which the caller keeps alive).

    Every input whose bytes lie in order in memory is cut into runs of whole chunks; all runs of all inputs go to
    the engine in one call (a few, on threads, when large), so a model's hundreds of small parameters cost one
    call. Inputs whose bytes need copying are staged one block at a time. The runs of one input add up
    (mod 2**64) before the final mix.
    """
    return _fingerprints(xs, None)


def cpu_copy_fingerprints(sources: Sequence[Any], destinations: Sequence[Any]) -> list[int]:
    """Copy each source into its destination and return the sources' fingerprints (what :func:`cpu_fingerprints`
    returns for ``sources``). Both numpy arrays or CPU torch tensors, each destination C-contiguous with its
    source's byte count. Where a source's bytes lie in order in memory the copy and the fingerprint are one pass
    (each word loaded once, summed and stored), so a staging copy costs about a copy; other sources are copied,
    then fingerprinted. The fingerprint is of the bytes read, so a store that goes wrong shows in a later
    fingerprint of the destination, not in this one."""
    if len(sources) != len(destinations):
        raise ValueError(f"{len(sources)} sources but {len(destinations)} destinations")
    spans = []
    for k, (x, y) in enumerate(zip(sources, destinations)):
        span = _cpu_span(y)
        nbytes = _nbytes(x)
        if span is None or span[1] != nbytes:
            raise ValueError(f"destination {k} must be C-contiguous with its source's {nbytes} bytes")
        spans.append(span[0])
    return _fingerprints(sources, spans)


def _fingerprints(xs: Sequence[Any], copy_to: list[int] | None) -> list[int]:
    """Fingerprints of ``xs``; with ``copy_to`` (an address per input), each input is copied there as well."""
    acc = [0] * len(xs)
    sizes: list[int] = []
    runs: list[int] = []
    owners: list[int] = []
    for k, x in enumerate(xs):
        span = _cpu_span(x)
        if span is None:
            if not isinstance(x, np.ndarray):
                x = x.detach()  # a parameter that requires grad: the same memory
            nbytes = _nbytes(x)
            if copy_to is not None:
                _copy_strided(x, copy_to[k], nbytes)
            acc[k] = _cpu_staged_partial(x, nbytes)
            sizes.append(nbytes)
            continue
        address, nbytes = span
        sizes.append(nbytes)
        for s in range(0, nbytes, RUN_BYTES):
            head = (address + s,) if copy_to is None else (address + s, copy_to[k] + s)
            runs += (*head, min(RUN_BYTES, nbytes - s), s // (4 * CHUNK_WORDS))
            owners.append(k)
    for k, p in zip(owners, _cpu_run_partials(runs, 3 if copy_to is None else 4)):
        acc[k] += p
    return [mix_int(a + mix_int(n + PHI)) for a, n in zip(acc, sizes)]


def _copy_strided(x: Any, address: int, nbytes: int) -> None:
    """Copy the bytes of ``x`` (not in order in memory) in logical C order to ``address``."""
    if not nbytes:
        return
    out = _host_bytes(address, nbytes)
    if isinstance(x, np.ndarray):
        out.view(x.dtype).reshape(x.shape)[...] = x
    else:
        import torch

        torch.from_numpy(out).view(x.dtype).view(x.shape).copy_(resolved_bits(x) if x.is_conj() or x.is_neg() else x)


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
            self._carry[self._held : self._held + take] = piece[:take]
            self._held += take
            start = take
            if self._held < self._CHUNK_BYTES:
                return
            self._fold(self._carry, self._CHUNK_BYTES)
            self._held = 0
        whole = (piece.size - start) // self._CHUNK_BYTES * self._CHUNK_BYTES
        if whole:
            self._fold(piece[start : start + whole], whole)
        rest = piece.size - start - whole
        if rest:
            self._carry[:rest] = piece[start + whole :]
            self._held = rest

    def _fold(self, words: Any, nbytes: int) -> None:
        address = words.__array_interface__["data"][0]
        runs: list[int] = []
        for s in range(0, nbytes, RUN_BYTES):
            runs += (address + s, min(RUN_BYTES, nbytes - s), (self._n + s) // self._CHUNK_BYTES)
        self._acc += sum(cpu_partials(runs))
        self._n += nbytes

    @property
    def value(self) -> int:
        """The fingerprint of every byte so far (the bytes folded in stay as they are: more may follow)."""
        acc, n = self._acc, self._n
        if self._held:
            address = self._carry.__array_interface__["data"][0]
            acc += cpu_partials([address, self._held, n // self._CHUNK_BYTES])[0]
            n += self._held
        return mix_int(acc + mix_int(n + PHI)) & MASK64

    @property
    def nbytes(self) -> int:
        """Bytes folded in so far."""
        return self._n + self._held
