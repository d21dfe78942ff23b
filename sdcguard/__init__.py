"""sdcguard: catch GPUs and CPU cores that compute wrong answers silently.

Importing ``sdcguard`` is cheap and never imports torch or cupy: the training-side names below are loaded on
first use, so the fleet scanner and the report CLI run on nodes without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it (loaded lazily, see __getattr__)
_LAZY: dict[str, str] = {
    "SdcguardError": "sdcguard.errors",
    "CorruptionDetected": "sdcguard.errors",
    "CheckpointCorrupted": "sdcguard.errors",
    "CheckpointError": "sdcguard.errors",
    "DeviceInfo": "sdcguard.records",
    "CaseResult": "sdcguard.records",
    "Incident": "sdcguard.records",
    "Store": "sdcguard.fleet.store",
    "QuarantinePolicy": "sdcguard.fleet.policy",
    "apply_policy": "sdcguard.fleet.policy",
    "ActionTemplate": "sdcguard.fleet.actions",
    "Fault": "sdcguard.inject.faults",
    "FaultModel": "sdcguard.inject.faults",
    "FaultRecord": "sdcguard.inject.faults",
    "parse_inject_spec": "sdcguard.inject.spec",
    "golden_output_hook": "sdcguard.inject.spec",
    # torch side: importing it loads torch, so it stays behind this lazy table
    "OpFaultMode": "sdcguard.inject.torch_faults",
    "load_suite": "sdcguard.golden",
    "Suite": "sdcguard.golden",
    "Case": "sdcguard.golden",
    "NumpyBackend": "sdcguard.golden",
    "CupyBackend": "sdcguard.golden",
    # the training guard (torch)
    "SDCGuard": "sdcguard.training.guard",
    "StepReport": "sdcguard.training.config",
    "CalibrationReport": "sdcguard.training.calibration",
    "GuardConfig": "sdcguard.training.config",
    "RngHook": "sdcguard.training.capture",
    "plan_roles": "sdcguard.training.roles",
    "Roles": "sdcguard.training.roles",
    "fingerprint": "sdcguard.fingerprints",
    "fingerprint_many": "sdcguard.fingerprints",
    "ReplicaCheck": "sdcguard.training.replica",
    "CheckpointInfo": "sdcguard.training.checkpoint",
    "SlowWatch": "sdcguard.training.timing",
    "SlowSettings": "sdcguard.fleet.slow",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sdcguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
