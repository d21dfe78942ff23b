"""Where the CUDA sources and the golden data live: inside the wheel, or beside the package in a checkout."""

from __future__ import annotations

from pathlib import Path

__all__ = ["kernels_dir", "golden_dir"]

_PKG = Path(__file__).resolve().parent


def _find(bundled: str, checkout: str) -> Path:
    # A wheel carries the data as sdcguard/_kernels and sdcguard/_golden; an editable checkout has it at the top.
    inside = _PKG / bundled
    if inside.is_dir():
        return inside
    return _PKG.parent / checkout


def kernels_dir() -> Path:
    """The directory of the golden-vector CUDA sources (``kernels/*.cu``)."""
    return _find("_kernels", "kernels")


def golden_dir() -> Path:
    """The directory of the golden data and its manifest (``golden_vectors/``)."""
    return _find("_golden", "golden_vectors")
