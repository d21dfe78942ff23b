"""The guard's settings and what one step reports: plain frozen dataclasses, validated once."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..errors import BadInput
from ..records import Incident
from .checksums.bound import DEFAULT_ROWS
from .checksums.precision import DEFAULT_SPLITS
from .step_check import Check

__all__ = [
    "DEFAULT_CHECKSUM_EVERY",
    "DEFAULT_REPLAY_EVERY",
    "GuardConfig",
    "StepReport",
    "OnDetect",
    "Escalate",
    "Check",
    "from_environment",
]

OnDetect = Literal["record", "skip", "raise", "exit"]
Escalate = Literal["raise", "exit", "recover", "off"]

DEFAULT_CHECKSUM_EVERY = 4
"""Checksum-check the matmuls of one step in 4 by default: the least frequent setting at which one-off matmul faults
are caught on their step at least 10 times as often as by replay at its default (80% of them on a checked step, so
20% at one in 4, against replay's 2%; docs/matmul-checksums.md has the figures and what each setting costs)."""

DEFAULT_REPLAY_EVERY = 50
"""Replay one step in 50 by default (docs/costs.md: what each period costs)."""


def from_environment(value: int | None, variable: str, default: int) -> int:
    """A period the code left unset (None): ``$variable`` where the launcher set it (``sdcguard plan --format env``
    writes ``SDCGUARD_REPLAY_EVERY`` and ``SDCGUARD_CHECKSUM_EVERY``), else ``default``. A value the code gives wins.
    A launcher sets one environment for every rank, so every rank samples the same steps."""
    if value is not None:
        return value
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise BadInput(f"${variable}={text!r}: must be an integer >= 0")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """Validated settings of a guard (``SDCGuard`` builds it from its keyword arguments)."""

    replay_every: int = DEFAULT_REPLAY_EVERY
    """Replay one step in N (0: never)."""
    shadows: Literal["peer"] | tuple[int, ...] = "peer"
    """``"peer"``: data-parallel ranks replay each other; or the global ranks of dedicated shadows."""
    weight_check_every: int = 100
    """Compare the weights across replicas every N steps in ``after_optimizer_step`` (0: never)."""
    store: str | None = None
    """The fleet store that incidents are recorded in (by the group's first rank): a SQLite file, or a PostgreSQL
    server's ``postgresql://`` URL (written with a local spool while it cannot be reached, see
    :mod:`sdcguard.fleet.store.spool`)."""
    on_detect: OnDetect = "skip"
    """``record``: only record; ``skip``: no rank commits a corrupted step; ``raise``: raise
    ``CorruptionDetected`` on every rank; ``exit``: every rank exits (see the exit-code contract)."""
    escalate: Escalate = "raise"
    """What a verdict that vetoing alone cannot contain does under ``on_detect="skip"``: a device named *sticky*
    (it corrupts every step, and only sampled steps are vetoed), or an unresolved verdict that repeats. ``raise``
    (the default): every rank raises ``CorruptionDetected`` at the same step, so the job stops with a traceback
    any launcher reports, and a script that wants to checkpoint or exit by the exit-code contract can catch it;
    ``exit``: every rank exits by the exit-code contract (86 on the suspect's rank, 85 elsewhere) for a wrapper that
    restarts without the suspect node; ``recover``: every rank rolls back to the last verified snapshot in one
    job-wide decision, the suspect leaves (exit 86), a dedicated shadow takes its place or the survivors go on when
    ``min_replicas`` allows, else every rank exits by the contract (:mod:`.recovery`); ``off``: keep vetoing
    sampled steps and go on (fault-injection campaigns).
    ``raise`` and ``exit`` under ``on_detect`` already act on every incident; ``record`` never acts."""
    checksum_every: int = DEFAULT_CHECKSUM_EVERY
    """Check every matmul of one step in N (forward, dX and dW) against its checksum (0: never); independent of
    replay, so the checks stay on when replay is off (:mod:`.checksums`)."""
    checksum_rows: int = DEFAULT_ROWS
    """Rows of a matmul's result summed per checksum: fewer catch smaller errors and cost more (2/N of the matmul's
    multiply-adds)."""
    checksum_splits: int = DEFAULT_SPLITS
    """The most partial sums a split-K matmul adds in its bf16/fp16 output where cuBLAS's reduced-precision
    reductions are allowed (torch's CUDA default): the bound's assumption (:mod:`.checksums.precision`)."""

    min_replicas: int | None = None
    """Under ``escalate="recover"`` without a spare: the fewest data-parallel replicas the job may go on with after
    the suspects left (None: never go on smaller; exit by the contract instead)."""

    @classmethod
    def of(cls, *, replay_every: int | None, checksum_every: int | None, **settings: Any) -> GuardConfig:
        """The guard's settings from its arguments, the periods it left unset (None) from the environment
        (:func:`from_environment`)."""
        return cls(
            replay_every=from_environment(replay_every, "SDCGUARD_REPLAY_EVERY", DEFAULT_REPLAY_EVERY),
            checksum_every=from_environment(checksum_every, "SDCGUARD_CHECKSUM_EVERY", DEFAULT_CHECKSUM_EVERY),
            **settings,
        )

    def __post_init__(self) -> None:
        if not isinstance(self.replay_every, int) or self.replay_every < 0:
            raise BadInput(f"replay_every must be an integer >= 0, got {self.replay_every!r}")
        if not isinstance(self.weight_check_every, int) or self.weight_check_every < 0:
            raise BadInput(f"weight_check_every must be an integer >= 0, got {self.weight_check_every!r}")
        for name in ("checksum_every", "checksum_rows", "checksum_splits"):
            value, least = getattr(self, name), 0 if name == "checksum_every" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise BadInput(f"{name} must be an integer >= {least}, got {value!r}")
        if self.on_detect not in ("record", "skip", "raise", "exit"):
            raise BadInput(f"on_detect must be record, skip, raise or exit, got {self.on_detect!r}")
        if self.escalate not in ("raise", "exit", "recover", "off"):
            raise BadInput(f"escalate must be raise, exit, recover or off, got {self.escalate!r}")
        if self.min_replicas is not None and (
            not isinstance(self.min_replicas, int) or isinstance(self.min_replicas, bool) or self.min_replicas < 1
        ):
            raise BadInput(f"min_replicas must be an integer >= 1 or None, got {self.min_replicas!r}")
        if self.shadows != "peer":
            if isinstance(self.shadows, str) or not all(isinstance(r, int) and r >= 0 for r in self.shadows):
                raise BadInput(f'shadows must be "peer" or a list of ranks, got {self.shadows!r}')
            if not self.shadows or len(set(self.shadows)) != len(self.shadows):
                raise BadInput(f"shadows must name at least one rank, each once, got {list(self.shadows)}")


@dataclass(frozen=True, kw_only=True)
class StepReport:
    """What one guarded step found."""

    step: int
    loss: torch.Tensor
    """The step's loss (mean over its micro-batches), detached; NaN when the guard did not see it (adapters)."""
    commit: bool
    """False when the optimizer must not apply this step (identical on every rank)."""
    incidents: tuple[Incident, ...] = ()
    """Incidents found during this call (a dedicated shadow's verdict may name an earlier step)."""
    replayed: bool = False
    """Whether this step was a sampled (replayed) step."""
    checks: tuple[Check, ...] = ()
    """The checks that ran on this step (replay is dropped for the run once replays prove nondeterministic)."""
    matmuls_run: int = 0
    """On a checksum-checked step: the matmuls this rank ran (forward and backward; fused attention included)."""
    matmuls_checked: int = 0
    """On a checksum-checked step: how many of them this rank checked against their checksums (each bound able to
    catch the smallest change claimed for its dtype)."""
    matmuls_unverifiable: int = 0
    """On a checksum-checked step: matmuls whose bound the backend's settings made too wide for that claim (or
    infinite); neither checked nor silently passed. The rest of ``matmuls_run`` were not looked at."""
    unverifiable: tuple[str, ...] = ()
    """Why, one line per setting (how many, an example, the setting that widens the bound)."""
    resume_from: int | None = None
    """Under ``escalate="recover"``: the job recovered at this step; the model and optimizer hold the verified state
    from before step ``resume_from``, and the loop goes on at that step, feeding the batches of
    ``guard.data_rank`` again (None: go on as usual)."""
