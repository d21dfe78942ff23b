"""Bit layouts of the number formats the injector corrupts: the one place that knows which bit is which.

A fault model talks about *bit classes* (sign, exponent, high mantissa, low mantissa) so that one fault
description means the same thing on fp64 and on fp8. This module maps each class to bit positions per format,
decodes raw bits to values (for value-range triggers) and names the special encodings (zero, NaN, Inf).

For integer formats there is no exponent; ``high_mantissa`` / ``low_mantissa`` are the upper / lower half of
the value bits (everything below the sign bit of a signed integer, every bit of an unsigned one).
Numpy only: torch calls in with a format name (``formats.get("bfloat16")``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import BadInput
from ..fp8 import e4m3_values

__all__ = ["BIT_CLASSES", "BitClass", "BitFormat", "FORMATS", "format_of", "get"]

BitClass = Literal["sign", "exponent", "high_mantissa", "low_mantissa"]
BIT_CLASSES: tuple[BitClass, ...] = ("sign", "exponent", "high_mantissa", "low_mantissa")

_UINT: dict[int, type[np.unsignedinteger]] = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


@dataclass(frozen=True, kw_only=True)
class BitFormat:
    """The bit layout of one number format."""

    name: str
    """Canonical name, as numpy / torch spell the dtype (``float32``, ``bfloat16``, ``float8_e4m3fn``, ``int8``)."""
    width: int
    """Bits per element: 8, 16, 32 or 64."""
    kind: Literal["float", "int", "uint"]
    exponent_bits: int = 0
    mantissa_bits: int = 0
    """Stored fraction bits (floats); value bits below the sign (ints)."""
    has_inf: bool = True
    """False for ``float8_e4m3fn``, whose only non-finite encoding is NaN."""

    @property
    def uint(self) -> type[np.unsignedinteger]:
        """The unsigned numpy integer of the same width: raw bits are handled as this type."""
        return _UINT[self.width]

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def all_bits(self) -> tuple[int, ...]:
        return tuple(range(self.width))

    def bits(self, bit_class: BitClass) -> tuple[int, ...]:
        """Bit positions (0 = least significant) of ``bit_class`` in this format; may be empty (int exponent)."""
        m = self.mantissa_bits
        if bit_class == "sign":
            return () if self.kind == "uint" else (self.width - 1,)
        if bit_class == "exponent":
            return tuple(range(m, m + self.exponent_bits))
        if bit_class == "high_mantissa":
            return tuple(range(m // 2, m))
        if bit_class == "low_mantissa":
            return tuple(range(0, m // 2))
        raise BadInput(f"unknown bit class {bit_class!r}: use one of {', '.join(BIT_CLASSES)}")

    def bit_class_of(self, bit: int) -> BitClass:
        """The class a bit position belongs to."""
        for c in BIT_CLASSES:
            if bit in self.bits(c):
                return c
        raise BadInput(f"bit {bit} is outside {self.name} (bits 0..{self.width - 1})")

    # -- special encodings (floats only) ------------------------------------------------------------------------
    @property
    def sign_mask(self) -> int:
        return 0 if self.kind == "uint" else 1 << (self.width - 1)

    @property
    def exponent_mask(self) -> int:
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits

    def nan_bits(self, sign: int) -> int:
        """A quiet NaN keeping ``sign`` (0 or the sign mask)."""
        self._need_float("nan")
        if not self.has_inf:  # e4m3fn: S.1111.111 is the only NaN
            return sign | self.exponent_mask | ((1 << self.mantissa_bits) - 1)
        return sign | self.exponent_mask | (1 << (self.mantissa_bits - 1))

    def inf_bits(self, sign: int) -> int:
        """Infinity keeping ``sign``; ``BadInput`` for a format without Inf."""
        self._need_float("inf")
        if not self.has_inf:
            raise BadInput(f"{self.name} has no Inf encoding: use pattern nan")
        return sign | self.exponent_mask

    def _need_float(self, what: str) -> None:
        if not self.is_float:
            raise BadInput(f"pattern {what} needs a floating-point dtype, got {self.name}")

    # -- decoding -----------------------------------------------------------------------------------------------
    def is_finite(self, bits: np.ndarray) -> np.ndarray:
        """Which raw-bit values encode finite numbers (always true for integers)."""
        b = np.asarray(bits).astype(np.uint64)
        if not self.is_float:
            return np.ones(b.shape, dtype=bool)
        if not self.has_inf:
            low = (1 << (self.exponent_bits + self.mantissa_bits)) - 1
            return (b & np.uint64(low)) != np.uint64(low)
        return (b & np.uint64(self.exponent_mask)) != np.uint64(self.exponent_mask)

    def is_finite_bits(self, bits: int) -> bool:
        """Whether one raw-bit value encodes a finite number."""
        if not self.is_float:
            return True
        if not self.has_inf:
            low = (1 << (self.exponent_bits + self.mantissa_bits)) - 1
            return bits & low != low
        return bits & self.exponent_mask != self.exponent_mask

    def decode(self, bits: np.ndarray) -> np.ndarray:
        """Values (float64) of raw bits of this format; used by value-range triggers."""
        b = np.ascontiguousarray(bits).astype(self.uint)
        if self.kind == "uint":
            return b.astype(np.float64)
        if self.kind == "int":
            return b.view(np.dtype(f"int{self.width}")).astype(np.float64)
        with np.errstate(invalid="ignore"):  # NaN payloads are expected here
            if self.name in ("float64", "float32", "float16"):
                return b.view(np.dtype(self.name)).astype(np.float64)
            if self.name == "bfloat16":  # the top half of a float32
                return (b.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
            if self.name == "float8_e5m2":  # the top half of a float16
                return (b.astype(np.uint16) << np.uint16(8)).view(np.float16).astype(np.float64)
        return e4m3_values()[b]  # float8_e4m3fn


def _ints() -> dict[str, BitFormat]:
    out = {}
    for w in (8, 16, 32, 64):
        out[f"int{w}"] = BitFormat(name=f"int{w}", width=w, kind="int", mantissa_bits=w - 1)
        out[f"uint{w}"] = BitFormat(name=f"uint{w}", width=w, kind="uint", mantissa_bits=w)
    return out


FORMATS: dict[str, BitFormat] = {
    "float64": BitFormat(name="float64", width=64, kind="float", exponent_bits=11, mantissa_bits=52),
    "float32": BitFormat(name="float32", width=32, kind="float", exponent_bits=8, mantissa_bits=23),
    "float16": BitFormat(name="float16", width=16, kind="float", exponent_bits=5, mantissa_bits=10),
    "bfloat16": BitFormat(name="bfloat16", width=16, kind="float", exponent_bits=8, mantissa_bits=7),
    "float8_e4m3fn": BitFormat(
        name="float8_e4m3fn", width=8, kind="float", exponent_bits=4, mantissa_bits=3, has_inf=False
    ),
    "float8_e5m2": BitFormat(name="float8_e5m2", width=8, kind="float", exponent_bits=5, mantissa_bits=2),
    **_ints(),
}
"""Every supported format by name."""


def get(name: str) -> BitFormat:
    """The format called ``name`` (``torch.bfloat16`` and ``bfloat16`` both work)."""
    key = name.removeprefix("torch.")
    key = {"double": "float64", "float": "float32", "half": "float16", "long": "int64", "int": "int32"}.get(key, key)
    try:
        return FORMATS[key]
    except KeyError:
        raise BadInput(f"cannot inject faults into dtype {name!r}: supported are {', '.join(FORMATS)}") from None


def format_of(dtype: np.dtype | type | str) -> BitFormat:
    """The format of a numpy dtype (ml_dtypes' bfloat16 / float8 included, by name)."""
    if isinstance(dtype, str):
        return get(dtype)
    return get(np.dtype(dtype).name)
