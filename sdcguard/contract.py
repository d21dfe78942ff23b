"""The training job's exit-code contract, in one place: the two statuses, the verdict a rank writes when it leaves
by the contract, and how a launcher turns the verdicts of its ranks into one exit status.

- 86 (:data:`EXIT_SUSPECT_DEVICE`): this rank's device is a suspect; do not restart the job on this node.
- 85 (:data:`EXIT_RESTART`): a peer was named; restart the job without the suspect node.

``torchrun`` reports any failed worker as its own exit 1 (with a ``ChildFailedError`` traceback), and its agent
stops every worker of the node when one exits non-zero. So every rank that leaves by the contract also appends one
JSON line, its *verdict*, to ``$SDCGUARD_VERDICT_FILE``: ``sdcguard launch`` (or the Slurm script) sets that
variable, runs the launcher, and exits with :func:`contract_status` of what its ranks wrote. A rank that leaves while
the others go on (a recovery) exits 0 under torchrun after writing its verdict (``left``), so the job is not torn
down; the wrapper still exits 86, so the scheduler drains the node.

No dependency beyond the standard library: the launcher runs where torch is not imported.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_SUSPECT_DEVICE",
    "EXIT_RESTART",
    "VERDICT_FILE_ENV",
    "Verdict",
    "write_verdict",
    "read_verdicts",
    "contract_status",
    "under_torchrun",
]

EXIT_SUSPECT_DEVICE = 86
"""Exit status of a rank whose own device was named: do not restart the job on this node."""
EXIT_RESTART = 85
"""Exit status of the other ranks: a peer was named; restart the job without the suspect node."""
VERDICT_FILE_ENV = "SDCGUARD_VERDICT_FILE"
"""Where a rank that leaves by the contract appends its :class:`Verdict` (one JSON line)."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What one rank said when it left by the contract (one line of the verdict file)."""

    status: int
    """86 or 85."""
    message: str
    """The one line the rank printed."""
    left: bool = False
    """The rank left alone and the job went on without it (a recovery)."""
    pid: int = 0
    incidents: list[dict[str, Any]] = field(default_factory=list)
    """The escalating incidents, as ``dataclasses.asdict`` of :class:`~sdcguard.records.Incident`."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "status": self.status,
                "message": self.message,
                "left": self.left,
                "pid": self.pid,
                "incidents": self.incidents,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        d = json.loads(text)
        return cls(
            status=int(d["status"]),
            message=str(d.get("message", "")),
            left=bool(d.get("left", False)),
            pid=int(d.get("pid", 0)),
            incidents=list(d.get("incidents", [])),
        )


def under_torchrun() -> bool:
    """Whether this process is a worker that torchrun's elastic agent started (it sets ``TORCHELASTIC_RESTART_COUNT``
    for every worker it starts)."""
    return "TORCHELASTIC_RESTART_COUNT" in os.environ


def write_verdict(verdict: Verdict) -> None:
    """Append ``verdict`` to ``$SDCGUARD_VERDICT_FILE`` (when set), and to torchrun's error file
    (``$TORCHELASTIC_ERROR_FILE``, whose message torchrun prints in its summary) when the rank is about to fail; an
    unwritable file is passed over (the exit status still says it)."""
    path = os.environ.get(VERDICT_FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
            f.write(verdict.to_json() + "\n")
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and not verdict.left:
        with contextlib.suppress(OSError), open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": {"message": verdict.message, "extraInfo": {"timestamp": "0", "py_callstack": ""}}}, f)


def read_verdicts(path: str | os.PathLike[str]) -> list[Verdict]:
    """The verdicts in a verdict file (none when it is missing; a torn last line, from a rank killed while it
    wrote, is passed over)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            out.append(Verdict.from_json(line))
    return out


def contract_status(verdicts: Sequence[Verdict], returncode: int) -> int:
    """The exit status a launcher wrapper reports for its ranks: 86 when one of them left as a suspect (even when
    the job went on without it: the node must be drained), else 85 when one left by the contract, else the
    launcher's own ``returncode``."""
    statuses = {v.status for v in verdicts}
    if EXIT_SUSPECT_DEVICE in statuses:
        return EXIT_SUSPECT_DEVICE
    if EXIT_RESTART in statuses:
        return EXIT_RESTART
    return returncode
