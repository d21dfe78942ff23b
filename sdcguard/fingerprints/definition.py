"""The fingerprint's definition and what is proven about it.

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

What is probabilistic: inputs of different lengths (above), changes that span several chunks (whole-chunk swaps
included: the chunk index enters the mixer), several words of one element (a swap of two 8-byte elements), or many
words at once are missed only if 64-bit mixed values cancel, about ``2**-64`` for unstructured changes, and only if
two 32-bit sums cancel together for changes inside one chunk.

Why two 32-bit sums and not one 64-bit sum: CPUs without AVX-512 have no vector 64-bit multiply, and 32-bit
multiply-and-sum runs at memory speed. A single linear sum modulo ``2**32`` cannot see a swap of two words that
differ only in their top bit (a float32 ``x`` and ``-x``), hence ``SB`` over the high half-words.

This module holds the definition's constants and arithmetic (the mixer, the weights, the chunk terms,
:func:`combine`); the CPU, torch and CUDA paths of the package compute exactly this.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "CHUNK_WORDS",
    "CHUNKS_PER_BLOCK",
    "BLOCK_WORDS",
    "WHOLE",
    "GPU_BLOCK_WORDS",
    "MASK64",
    "PHI",
    "SEED",
    "MIX_C1",
    "MIX_C2",
    "COMBINE_SALT",
    "mix_int",
    "mix_np",
    "weights",
    "xp_partial",
    "xp_finish",
    "signed64",
    "unsigned64",
    "combine",
]

_M = 14
CHUNK_WORDS = 1 << _M
"""Words (4 bytes) per chunk: the unit inside which swaps and double flips are detected with certainty."""
CHUNKS_PER_BLOCK = 16
BLOCK_WORDS = CHUNK_WORDS * CHUNKS_PER_BLOCK  # 1 MiB of input per block; temporaries: 2 x 1 MiB
WHOLE = CHUNK_WORDS * (1 << 30)  # "one block": dense views on a GPU need no temporaries at all
GPU_BLOCK_WORDS = CHUNK_WORDS * 1024  # 64 MiB blocks on a GPU: fewer, larger kernels (launches dominate small ones)

MASK64 = (1 << 64) - 1
PHI = 0x9E3779B97F4A7C15
SEED = 0x5D6C_9A2B_3F17_E4C1
MIX_C1 = 0xBF58476D1CE4E5B9
MIX_C2 = 0x94D049BB133111EB
COMBINE_SALT = 0x2545_F491_4F6C_DD1D

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("sdcguard.fingerprints assumes a little-endian host")


def mix_int(z: int) -> int:
    """splitmix64 finalizer on a Python int (the reference for the vectorized versions)."""
    z &= MASK64
    z ^= z >> 30
    z = (z * MIX_C1) & MASK64
    z ^= z >> 27
    z = (z * MIX_C2) & MASK64
    return z ^ (z >> 31)


def signed64(v: int) -> int:
    """``v`` modulo 2**64 as a signed 64-bit integer (how a fingerprint travels in an int64 tensor)."""
    v &= MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def unsigned64(v: int) -> int:
    """``v`` modulo 2**64, in ``[0, 2**64)``: a fingerprint read back from an int64 tensor (undoes :func:`signed64`)."""
    return v & MASK64


@functools.cache
def weights() -> tuple[np.ndarray, np.ndarray]:
    """The fixed weight tables ``T`` and ``U`` (int32, ``CHUNK_WORDS`` each), defined in the module docstring."""
    p = np.arange(CHUNK_WORDS // 2, dtype=np.uint64)
    low = np.empty(CHUNK_WORDS, dtype=np.uint64)
    low[0::2] = p
    low[1::2] = np.uint64(1 << (_M - 1)) + np.uint64(3) * p
    idx = np.arange(CHUNK_WORDS, dtype=np.uint64)
    tables = []
    for salt in (1, 2):
        r = mix_np(idx + np.uint64((salt * PHI) & MASK64))
        w = (np.uint64(2) * low + np.uint64(1) + (r << np.uint64(_M + 3))) & np.uint64(0xFFFFFFFF)
        tables.append(w.astype(np.uint32).view(np.int32))
    return tables[0], tables[1]


def mix_np(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array of numpy or cupy (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(MIX_C1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(MIX_C2)
    return z ^ (z >> np.uint64(31))


def xp_finish(v: Any, xp: Any, nbytes: int) -> Any:
    """The fingerprint from the chunk values ``v``, as a 1-element uint64 array on the same device."""
    return mix_np(xp_partial(v, 0, xp).reshape(1) + np.uint64(mix_int(nbytes + PHI)))


def xp_partial(v: Any, c0: int, xp: Any) -> Any:
    """``sum_c mix(V_c + c*PHI + SEED)`` over chunk values ``v`` numbered from ``c0``: a 0-d uint64 array."""
    c = xp.arange(c0, c0 + v.size, dtype=np.uint64)
    return mix_np(v + c * np.uint64(PHI) + np.uint64(SEED)).sum(dtype=np.uint64)


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
        acc += mix_int((v & MASK64) + (i + 1) * PHI + COMBINE_SALT)
    return acc & MASK64
