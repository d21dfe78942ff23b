"""Exceptions of sdcguard.

Every ``SdcguardError`` is a problem a user can act on; the CLI prints its message as one line on stderr and
exits with code 2. ``CorruptionDetected`` is different: it is what the training guard raises with
``on_detect="raise"`` when a step was found corrupted.
"""

from __future__ import annotations

__all__ = [
    "SdcguardError",
    "BadInput",
    "Unfingerprintable",
    "StoreError",
    "SchemaTooNew",
    "GoldenDataError",
    "SuiteError",
    "NoDevice",
    "CorruptionDetected",
    "CheckpointError",
    "CheckpointCorrupted",
    "DISTRIBUTION",
    "needs_extra",
]

DISTRIBUTION = "sdcguard-fleet"
"""What pip calls this project (PyPI's ``sdcguard`` is another project): its extras add the optional parts."""


class SdcguardError(Exception):
    """A problem the user can fix; the CLI prints it as one line and exits 2."""


class BadInput(SdcguardError):
    """An argument or a spec could not be understood."""


class Unfingerprintable(BadInput, TypeError):
    """A value whose raw bits cannot be read for a fingerprint (a sparse, quantized or meta tensor, a tensor subclass
    that holds no data of its own, an object array). Also a ``TypeError``: the value is of the wrong kind."""


class StoreError(SdcguardError):
    """The fleet store cannot be opened, read or written (not SQLite, unreadable, locked for too long)."""


class SchemaTooNew(StoreError):
    """The store was written by a newer sdcguard; it is left untouched."""


class GoldenDataError(SdcguardError):
    """Golden data is missing or does not match its manifest: the suite, not the device, is suspect."""


class SuiteError(SdcguardError):
    """The golden suite itself failed (a kernel did not compile, a backend is broken): never a device failure."""


class NoDevice(SdcguardError):
    """No device matched the request, or the requested device cannot run the suite."""


class CheckpointError(SdcguardError):
    """A checkpoint is missing, truncated, foreign, or (with ``strict=True``) written without fingerprints."""


class CheckpointCorrupted(SdcguardError):
    """Tensors read from a checkpoint differ from what was saved (``keys``: their state-dict keys; ``ranks``: the
    ranks that read them)."""

    def __init__(self, message: str, keys: tuple[str, ...] = (), ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys
        self.ranks = ranks


class CorruptionDetected(RuntimeError):
    """Raised by the training guard (``on_detect="raise"``) when a step was found corrupted.

    ``incidents`` holds the incidents of that step.
    """

    def __init__(self, message: str, incidents: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.incidents = incidents


def needs_extra(what: str, module: str, extra: str) -> BadInput:
    """The one-line error for ``what`` when ``module``, an optional dependency from the ``extra`` extra, is absent
    (the scan-node install has no torch and no matplotlib)."""
    return BadInput(f"{what} needs {module}, which is not installed here: pip install '{DISTRIBUTION}[{extra}]'")
