"""Raw-bit helpers shared by the generators, the reference arithmetic and the comparison.

The reference side rounds exactly with Python integers (:func:`round_exact`), never with the floating-point unit
whose results it judges; the generators draw raw 64-bit words from PCG64, whose stream numpy guarantees stable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
from typing import Any

import numpy as np

from ..fp8 import e4m3_values

__all__ = [
    "FORMATS",
    "raw_words",
    "uint_view",
    "hex_bits",
    "sha256_bytes",
    "decompose",
    "round_exact",
    "compose",
    "fmix32",
    "same_bytes",
    "failure_digest",
    "e4m3_table",
    "e4m3_encode",
]

# precision p (significand bits incl. the hidden one), minimum normal exponent, storage bits
FORMATS: dict[str, tuple[int, int, int]] = {
    "fp64": (53, -1022, 64),
    "fp32": (24, -126, 32),
    "tf32": (11, -126, 32),
    "fp16": (11, -14, 16),
    "bf16": (8, -126, 16),
    "fp8": (4, -6, 8),  # OCP e4m3 ("fn"): bias 7, no infinities, 0x7f/0xff are NaN
}

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def raw_words(seed: int, stream: int, n: int) -> np.ndarray:
    """``n`` raw uint64 words of PCG64 seeded by ``(seed, stream)`` (bit-stable across numpy versions)."""
    bg = np.random.PCG64(np.random.SeedSequence([seed, stream]))
    return np.asarray(bg.random_raw(n), dtype=np.uint64)


def uint_view(a: np.ndarray) -> np.ndarray:
    """The same bytes as unsigned integers of the element's width: the unit of a bit-exact comparison."""
    a = np.ascontiguousarray(a)
    return a.view(_UINT[a.dtype.itemsize])


def hex_bits(value: Any, itemsize: int) -> str:
    """``0x...`` with exactly ``2 * itemsize`` hex digits."""
    return f"0x{int(value):0{2 * itemsize}x}"


def sha256_bytes(a: np.ndarray) -> str:
    """sha256 (hex) of an array's raw bytes in C order."""
    return hashlib.sha256(np.ascontiguousarray(a).data).hexdigest()


def decompose(x: float) -> tuple[int, int, int]:
    """``(sign, m, e)`` with ``x == (-1)**sign * m * 2**e`` and ``m`` a non-negative integer (x finite)."""
    f = float(x)
    sign = 1 if (f < 0 or (f == 0 and np.signbit(f))) else 0
    num, den = abs(f).as_integer_ratio()
    e = -(den.bit_length() - 1)  # den is a power of two
    return sign, num, e


def round_exact(num: int, den: int, e2: int, p: int) -> tuple[int, int]:
    """Round the exact positive value ``num / den * 2**e2`` to ``p`` significant bits, ties to even.

    Returns ``(q, e)`` with the rounded value ``q * 2**e`` and ``q < 2**p`` or ``q == 2**p``. Normal range only:
    the generators keep every result away from subnormals and overflow.
    """
    if num <= 0 or den <= 0:
        raise ValueError("round_exact needs a positive value")
    s = p - (num.bit_length() - den.bit_length())
    while True:
        n2, d2 = (num << s, den) if s >= 0 else (num, den << -s)
        q, r = divmod(n2, d2)
        if q >= 1 << p:
            s -= 1
        elif q < 1 << (p - 1):
            s += 1
        else:
            break
    twice = 2 * r
    if twice > d2 or (twice == d2 and q & 1):
        q += 1
    return q, e2 - s


def compose(sign: int, q: int, e: int) -> float:
    """The float64 ``(-1)**sign * q * 2**e`` (exact when it is representable)."""
    v = float(np.ldexp(float(q), e))
    return -v if sign else v


def fmix32(x: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finalizer on uint32 (wrapping arithmetic): the random memory pattern."""
    x = x.astype(np.uint32, copy=True)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return x


@functools.cache
def _memcmp() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name).memcmp
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """True when two C-contiguous arrays of equal size hold the same bytes (libc memcmp: one streaming read of
    each, several times faster than an elementwise numpy comparison on large buffers)."""
    if a.nbytes != b.nbytes:
        return False
    memcmp = _memcmp()
    if memcmp is None or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return bool(np.array_equal(uint_view(a).reshape(-1), uint_view(b).reshape(-1)))
    return memcmp(a.ctypes.data, b.ctypes.data, a.nbytes) == 0


@functools.cache
def e4m3_table() -> np.ndarray:
    """float32 value of every e4m3 byte (index = the byte): :func:`sdcguard.fp8.e4m3_values`, exact in float32."""
    out = e4m3_values().astype(np.float32)
    out.flags.writeable = False
    return out


def e4m3_encode(values: np.ndarray) -> np.ndarray:
    """Exactly representable float64 values -> e4m3 bytes (``ValueError`` for anything not representable)."""
    table = e4m3_table()
    lookup = {float(v): b for b, v in enumerate(table.tolist()) if not np.isnan(v) and b != 0x80}
    try:
        return np.array([lookup[float(v)] for v in values.reshape(-1)], dtype=np.uint8).reshape(values.shape)
    except KeyError as e:
        raise ValueError(f"{e.args[0]!r} is not an e4m3 value") from None


def failure_digest(output: np.ndarray, march: tuple[int, int, int] | None = None) -> str:
    """The digest a failed result carries: sha256 of the output bytes, extended by a memory march's first failing
    read ``(element, expected, actual)`` when the march saw one. Two devices with equal digests produced the same
    wrong answer (the circuit breaker's signal), which a march failure with intact final contents would otherwise
    fake, since its output then equals the golden."""
    h = hashlib.sha256(np.ascontiguousarray(output).data)
    if march is not None:
        # %d, as when the stored digests were made: any integer-like value (a numpy scalar too) prints one way.
        h.update(("march:%d:%d:%d" % march).encode())  # noqa: UP031
    return h.hexdigest()
