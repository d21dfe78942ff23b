"""The fleet scanner: finds idle devices, runs the golden suite within a budget, records, applies the policy.

``sdcguard scan`` and ``python -m fleet_scan`` are its command line (:mod:`.command`, which needs nothing of
:mod:`sdcguard.cli`). The pieces: :mod:`.options` (the scan's settings, defined once) and :mod:`.config` (the
config file); :mod:`.devices` (which devices, their telemetry, idle checks and per-device locks);
:mod:`.device_scan` (one device's scan in its own process: case order and budget, retests in a fresh process,
crash-safe recording, its summary, the requests its processes get); :mod:`.stop` (SIGTERM and SIGINT),
:mod:`.runner` (the whole machine, then the policy), :mod:`.events` (what the scan reports, one dataclass per kind),
:mod:`.progress` (rich bar or JSON lines) and :mod:`.sim` (a simulated fleet running the same recording and policy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .devices.discovery import ScanTarget, discover_cpus, discover_gpus, select_targets
    from .options import ScanOptions
    from .runner import ScanOutcome, run_scan

__all__ = ["ScanTarget", "ScanOptions", "ScanOutcome", "run_scan", "discover_cpus", "discover_gpus", "select_targets"]

_HOMES = {
    "ScanTarget": ".devices.discovery",
    "discover_cpus": ".devices.discovery",
    "discover_gpus": ".devices.discovery",
    "select_targets": ".devices.discovery",
    "ScanOptions": ".options",
    "ScanOutcome": ".runner",
    "run_scan": ".runner",
}
"""Where each public name lives, imported on first use: a command that needs only :mod:`.config` (``sdcguard
report`` reads the policy's settings from it) does not load the scanner's runner and device discovery."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value
