"""The files of a verified DCP checkpoint, and how to find checkpoints in a directory.

A verified checkpoint is a directory holding DCP's files (``.metadata``: the index of every saved item; ``*.distcp``:
the data) and ``sdcguard.json`` (:mod:`.record`), written last. One module knows those names, so ``save``,
``async_save``, ``scrub`` and the fallback of ``load`` agree on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .record import file_fingerprint, read_record

__all__ = ["SIDECAR", "METADATA", "is_checkpoint", "metadata_damage", "Candidate", "candidates", "describe_failure"]

SIDECAR = "sdcguard.json"
"""The file, inside a DCP checkpoint, that holds the fingerprints of every saved tensor."""
METADATA = ".metadata"
"""DCP's index of a checkpoint (which item lies where in which data file)."""


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a DCP checkpoint directory (it has DCP's ``.metadata``)."""
    return (path / METADATA).is_file()


def metadata_damage(path: Path, body: dict[str, Any]) -> str | None:
    """Why the checkpoint's ``.metadata`` does not match its record (None: it does, or the record predates the
    metadata's fingerprint)."""
    expected = body.get("metadata")
    if not expected:
        return None
    try:
        found = file_fingerprint(path / METADATA)
    except OSError as e:
        return f"its DCP metadata file {METADATA} cannot be read ({e.strerror or e})"
    if found != expected:
        return f"its DCP metadata file {METADATA} is damaged (fingerprint {found}, recorded {expected})"
    return None


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A checkpoint found in a directory, with what its record says."""

    path: Path
    step: int | None
    verified: bool | None
    problem: str | None = None
    """Why it cannot be a fallback (no record, a damaged record); None when it can be tried."""


def candidates(root: Path) -> list[Candidate]:
    """The checkpoints directly under ``root`` (or ``root`` itself when it is one), newest first: by the step their
    record names, then by modification time. Reading records never raises: a problem is noted on the candidate."""
    found = [root] if is_checkpoint(root) else sorted(p for p in root.iterdir() if p.is_dir() and is_checkpoint(p))
    out: list[Candidate] = []
    for path in found:
        try:
            body = read_record(path / SIDECAR, str(path), strict=True)
        except CheckpointError as e:
            out.append(Candidate(path=path, step=None, verified=None, problem=str(e)))
            continue
        assert body is not None
        step = body.get("step")
        out.append(
            Candidate(
                path=path,
                step=step if isinstance(step, int) else None,
                verified=body.get("verified") if isinstance(body.get("verified"), bool) else None,
            )
        )
    return sorted(out, key=lambda c: (c.step if c.step is not None else -1, _mtime(c.path)), reverse=True)


def _mtime(path: Path) -> float:
    try:
        return (path / METADATA).stat().st_mtime
    except OSError:
        return 0.0


def describe_failure(e: BaseException) -> str:
    """One line for an error of DCP (its ``CheckpointException`` keeps each rank's (exception, traceback))."""
    failures = getattr(e, "failures", None) or {}
    inner: Any = next(iter(failures.values()), e)
    cause = inner[0] if isinstance(inner, tuple) and inner else inner
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text.splitlines()[0][:200]}" if text else type(cause).__name__
