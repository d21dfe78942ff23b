"""Matmul checksums: :mod:`.precision` (how the backend computes a matmul, read from torch's settings),
:mod:`.bound` (the checksum identity and its rigorous rounding bound, with the C engine ``_core``), :mod:`.mode` (the
dispatch mode that checks every matmul of a step) and :mod:`.round` (what a step's checks conclude on every rank).
``check_matmul`` and ``ChecksumMode`` are importable from here."""

from .bound import CLAIMS, DEFAULT_ROWS, VacuousBound, c_engine_available, check_matmul, unverifiable
from .mode import ChecksumFailure, ChecksumMode, MatmulCall, Pass
from .precision import DEFAULT_SPLITS, Precision, fp32_internal, precision_for

__all__ = [
    "check_matmul",
    "unverifiable",
    "VacuousBound",
    "CLAIMS",
    "precision_for",
    "fp32_internal",
    "Precision",
    "DEFAULT_ROWS",
    "DEFAULT_SPLITS",
    "c_engine_available",
    "ChecksumMode",
    "ChecksumFailure",
    "MatmulCall",
    "Pass",
]
