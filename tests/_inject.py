"""Shared helpers of the fault-injection tests: hypothesis strategies for arrays of every supported format."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from sdcguard.inject import formats

# numpy holds bfloat16 / float8 as raw unsigned bits; the format name tells the model what they are.
FORMAT_NAMES = tuple(formats.FORMATS)


def raw_bits(a: np.ndarray, fmt: formats.BitFormat) -> np.ndarray:
    """The raw bits of ``a`` as a flat uint64 array (C order)."""
    return np.ascontiguousarray(a).reshape(-1).view(fmt.uint).astype(np.uint64)


@st.composite
def arrays(draw: st.DrawFn, *, finite: bool = False, min_size: int = 1) -> tuple[np.ndarray, str]:
    """``(array, format name)``: random bits of any supported format, any small shape."""
    name = draw(st.sampled_from(FORMAT_NAMES))
    fmt = formats.get(name)
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)))
    n = int(np.prod(shape)) if shape else 1
    if n < min_size:
        shape, n = (min_size,), min_size
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**fmt.width, size=n, dtype=np.uint64, endpoint=False).astype(fmt.uint)
    if finite and fmt.is_float:
        # keep the values finite: clear the top exponent bit where the value is not finite
        top_exponent_bit = 1 << (fmt.mantissa_bits + fmt.exponent_bits - 1)
        keep = fmt.uint(~top_exponent_bit & ((1 << fmt.width) - 1))
        bits = np.where(fmt.is_finite(bits), bits, bits & keep)
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") or fmt.kind == "uint":
        arr = bits
    else:
        arr = bits.view(np.dtype(name))
    return arr.reshape(shape), name
