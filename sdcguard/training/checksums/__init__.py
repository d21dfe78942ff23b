"""Matmul checksums: :mod:`.bound` (the checksum identity and its rigorous rounding bound, with the C engine
``_core``), :mod:`.mode` (the dispatch mode that checks every matmul of a step) and :mod:`.round` (what a step's
checks conclude on every rank). ``check_matmul`` and ``ChecksumMode`` are importable from here."""

from .bound import DEFAULT_ROWS, Precision, c_engine_available, check_matmul, precision_for
from .mode import ChecksumFailure, ChecksumMode, MatmulCall, Pass

__all__ = [
    "check_matmul",
    "precision_for",
    "Precision",
    "DEFAULT_ROWS",
    "c_engine_available",
    "ChecksumMode",
    "ChecksumFailure",
    "MatmulCall",
    "Pass",
]
