"""The 8-bit float OCP e4m3 ("fn": bias 7, no infinities, ``S.1111.111`` its only NaN) as a table of its 256 values.

numpy has no fp8 type, so fp8 data is handled as raw bytes and decoded by this one table: the golden suite's
fp8 inputs and CPU reference, and the fault injector's value triggers on ``float8_e4m3fn`` data.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["e4m3_values"]


@functools.cache
def e4m3_values() -> np.ndarray:
    """The float64 value of every e4m3 byte (index = the byte; NaN at 0x7f and 0xff), read-only, built with
    integer arithmetic: ``m * 2**-9`` for a subnormal, ``(8 + m) * 2**(e - 10)`` (``1.m * 2**(e - 7)``) otherwise."""
    out = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            out[b] = np.nan
        elif e == 0:
            out[b] = sign * float(np.ldexp(float(m), -9))
        else:
            out[b] = sign * float(np.ldexp(float(8 + m), e - 10))
    out.flags.writeable = False
    return out
