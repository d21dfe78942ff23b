"""Writing a published file atomically: a temporary file in the same directory, then a rename over the target.

A reader (node-exporter's textfile collector, a web server serving the HTML report) sees the old file or the new
one, never half of one; a full disk or a killed writer leaves the old file in place.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ...errors import BadInput

__all__ = ["write_atomic"]


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; ``BadInput`` with one clear line for a path that cannot
    be written (missing directory, a directory, no permission)."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise BadInput(f"cannot write {path}: directory {directory} does not exist")
    if path.is_dir():
        raise BadInput(f"cannot write {path}: it is a directory")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes it 0600; the collector or web server may run as another user
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
        raise
