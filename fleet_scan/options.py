"""The scanner's configuration: one frozen dataclass handed from the CLI to every per-device worker process."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from sdcguard.errors import BadInput

__all__ = ["ScanOptions", "DEFAULT_BUDGET_S", "DEFAULT_RETESTS"]

DEFAULT_BUDGET_S = 60.0
"""Per-device budget of a scan: a minute a day finds a device failing one execution in a thousand within a day
(see ``benchmarks/fleet_policy.py``) and costs a GPU node less than 0.1% of its time."""
DEFAULT_RETESTS = 3
"""Retests of a failing case, in a fresh process, to tell a transient from a sticky fault."""


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """How each device is scanned (everything a worker process needs besides its device)."""

    db: str
    """Path of the fleet store."""
    budget_s: float | None = DEFAULT_BUDGET_S
    """Wall-clock seconds per device, from the scan's start to its final record; None: one pass over the suite."""
    retests: int = DEFAULT_RETESTS
    """Retests of a failing case in a fresh process (0: no retest; the failure's ``sticky`` stays None)."""
    inject: str | None = None
    """Fire-drill fault spec (:func:`sdcguard.inject.faults.parse_inject_spec`); None in production."""
    only_idle: bool = True
    """Scan only idle devices and stop (``preempted``) when a job appears; False scans whatever is asked."""
    idle_window_s: float = 1.0
    """Window of the idle check before a scan."""
    gpu_util_max: float = 5.0
    """A GPU above this utilization (%) over the window is busy."""
    cpu_busy_max: float = 50.0
    """A CPU core kept busier than this (%) by other processes is busy."""
    lock_dir: str | None = None
    """Directory of the per-device lock files (default: :func:`fleet_scan.idle.default_lock_dir`)."""
    golden_dir: str | None = None
    """Golden data directory (default: the one shipped with sdcguard)."""
    json: bool = False
    """Progress as JSON lines even on a terminal."""

    def __post_init__(self) -> None:
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise BadInput(f"--budget must be a positive number of seconds, got {self.budget_s}")
        if self.retests < 0:
            raise BadInput(f"--retests must be >= 0, got {self.retests}")
        if self.idle_window_s < 0:
            raise BadInput(f"idle window must be >= 0 seconds, got {self.idle_window_s}")
        for name in ("gpu_util_max", "cpu_busy_max"):
            value = getattr(self, name)
            if not 0 <= value <= 100:
                raise BadInput(f"{name.replace('_', '-')} must be a percentage 0..100, got {value}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanOptions:
        return cls(**data)
