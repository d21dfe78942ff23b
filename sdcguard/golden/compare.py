"""Bit-exact comparison of a case's output with its golden: the first differing element and how it differs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SuiteError
from .bits import hex_bits, same_bytes, uint_view

__all__ = ["Mismatch", "compare_bits"]


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    """How an output differs from its golden (raw bits, never values: -0.0 != +0.0 and NaN payloads count)."""

    count: int
    """Number of differing elements."""
    element: int
    """Flat index of the first differing element."""
    expected: str
    actual: str
    xor_mask: str
    """``expected ^ actual`` in hex: the flipped bits."""


def compare_bits(expected: np.ndarray, actual: np.ndarray) -> Mismatch | None:
    """None when ``actual`` has exactly the bits of ``expected``; else the first mismatch.

    A shape or dtype that differs is a broken backend (or hook), not a device fault: ``SuiteError``.
    """
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise SuiteError(
            f"output has shape {actual.shape} {actual.dtype}, golden has {expected.shape} {expected.dtype}: "
            "the backend or the output hook is broken"
        )
    e = uint_view(expected).reshape(-1)
    a = uint_view(actual).reshape(-1)
    if same_bytes(e, a):
        return None
    bad = np.flatnonzero(e != a)
    i = int(bad[0])
    size = expected.dtype.itemsize
    ev, av = int(e[i]), int(a[i])
    return Mismatch(
        count=int(bad.size),
        element=i,
        expected=hex_bits(ev, size),
        actual=hex_bits(av, size),
        xor_mask=hex_bits(ev ^ av, size),
    )
