"""What a section is given (:class:`Context`) and how it says it cannot run here (:class:`Skip`).

A section is skipped only where the GPU step cannot run at all: a dry run, or a machine with no usable CUDA
device. Anything else that stops a check (a missing package on a GPU machine, a crash) is a failure: the point of
the run is to prove every path, and an unproven path needs someone's attention.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Context", "Skip", "cuda_unavailable_reason", "run_command"]


class Skip(Exception):
    """The section's GPU step cannot run here; the message says why."""


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """Why CUDA cannot run here (cupy missing, no driver, no device), or None where it can."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        return f"cupy not importable ({type(e).__name__}: {e})"
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        return f"no usable CUDA device ({type(e).__name__}: {first})"
    return None if n > 0 else "no CUDA device found"


@dataclass(frozen=True, kw_only=True)
class Context:
    """One section's run: where results go, whether it is a dry run, its time limit and the GPU to use."""

    out: Path
    """The results folder (results.json, the log, recorded candidates)."""
    dry_run: bool = False
    """Go through the section's preflight only and skip every GPU step, saying what it would have run."""
    timeout_s: float = 60.0
    """This section's limit: sub-steps budget themselves from :meth:`left` so they fail with a reason first."""
    device: int = 0
    """CUDA ordinal of the GPU that single-device steps use (``cuda:0``)."""
    started: float = field(default_factory=time.monotonic)

    def left(self, margin: float = 3.0) -> float:
        """Seconds left before this section's limit, less ``margin`` (never below 1)."""
        return max(1.0, self.timeout_s - (time.monotonic() - self.started) - margin)

    def require_gpu(self, would: str) -> None:
        """Raise :class:`Skip` when the GPU step cannot run here; ``would`` says what it would have run."""
        if self.dry_run:
            raise Skip(f"dry run: would {would}")
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise Skip(f"no CUDA here ({reason}): would {would}")


def run_command(args: list[str], *, timeout: float) -> tuple[int, str, str]:
    """Run ``python -m ...`` style commands with this interpreter: ``(exit code, stdout, stderr)``; a command
    that outlives ``timeout`` is killed and reported as exit code 124 with a line in stderr."""
    cmd = [sys.executable, *args] if args and args[0] == "-m" else args
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err + f"\n(killed after {timeout:.0f} s)"
    return done.returncode, done.stdout, done.stderr
