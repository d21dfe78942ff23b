"""The golden-vector suite: known-answer cases, their exact reference outputs, and backends that run them.

``load_suite()`` loads ``golden_vectors/`` (checking every sha256); a backend runs one case and compares its
output bit for bit with the golden::

    suite = load_suite()
    backend = NumpyBackend(core=3)                 # or CupyBackend(index=0) on a GPU
    for case in backend.cases():
        result = backend.run(case)                 # a CaseResult; result.passed False on any differing bit

Importing this package never imports cupy; the CUDA path loads it on first use.
"""

from __future__ import annotations

from typing import Any

from .backend import OutputHook, default_suite
from .cases import CASES, FAMILIES, GENERATOR_VERSION, PORTABLE_CASES, Case, case_by_id
from .compare import Mismatch, compare_bits
from .numpy_backend import NumpyBackend
from .suite import Suite, VerifyReport, generate, load_suite, verify

__all__ = [
    "CASES",
    "FAMILIES",
    "GENERATOR_VERSION",
    "PORTABLE_CASES",
    "Case",
    "case_by_id",
    "Mismatch",
    "compare_bits",
    "NumpyBackend",
    "CupyBackend",
    "OutputHook",
    "default_suite",
    "Suite",
    "VerifyReport",
    "generate",
    "load_suite",
    "verify",
]


def __getattr__(name: str) -> Any:
    # The GPU backend's module is only imported when asked for (cupy itself loads when a backend is created).
    if name == "CupyBackend":
        from .cupy_backend import CupyBackend

        return CupyBackend
    raise AttributeError(f"module 'sdcguard.golden' has no attribute {name!r}")
