"""sdcguard: catch GPUs and CPU cores that compute wrong answers silently.

Importing ``sdcguard`` is cheap and never imports torch or cupy: the training-side names below are loaded on
first use, so the fleet scanner and the report CLI run on nodes without torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
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
    "Store": "sdcguard.fleet.store.store",
    "QuarantinePolicy": "sdcguard.fleet.policy.settings",
    "apply_policy": "sdcguard.fleet.policy.run",
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
    "CalibrationReport": "sdcguard.training.verdicts.calibration",
    "GuardConfig": "sdcguard.training.config",
    "RngHook": "sdcguard.training.replay.capture",
    "plan_roles": "sdcguard.training.rounds.roles",
    "Roles": "sdcguard.training.rounds.roles",
    "fingerprint": "sdcguard.fingerprints",
    "fingerprint_many": "sdcguard.fingerprints",
    "ReplicaCheck": "sdcguard.training.replica",
    "CheckpointInfo": "sdcguard.checkpoint.dcp",
    "SlowWatch": "sdcguard.training.timing",
    "stage_output": "sdcguard.training.replay.stage",
    "SlowSettings": "sdcguard.fleet.slow",
}

__all__ = ["__version__", *_LAZY]

MOVED: dict[str, str] = {
    "sdcguard.training.taps": "sdcguard.training.hooks.taps",
    "sdcguard.training.ddp": "sdcguard.training.hooks.ddp",
    "sdcguard.training.fsdp": "sdcguard.training.hooks.fsdp",
    "sdcguard.training.capture": "sdcguard.training.replay.capture",
    "sdcguard.training.observe": "sdcguard.training.replay.observe",
    "sdcguard.training.peer": "sdcguard.training.rounds.peer",
    "sdcguard.training.shadows": "sdcguard.training.rounds.shadows",
    "sdcguard.training.wire": "sdcguard.training.rounds.wire",
    "sdcguard.training.roles": "sdcguard.training.rounds.roles",
    "sdcguard.training.pairing": "sdcguard.training.rounds.pairing",
    "sdcguard.training.attribution": "sdcguard.training.verdicts.attribution",
    "sdcguard.training.calibration": "sdcguard.training.verdicts.calibration",
    "sdcguard.training.outcomes": "sdcguard.training.verdicts.outcomes",
    "sdcguard.training.verification": "sdcguard.training.verdicts.verification",
    "sdcguard.training.checksum_bound": "sdcguard.training.checksums.bound",
    "sdcguard.training.checksum_round": "sdcguard.training.checksums.round",
    "sdcguard.training.checkpoint": "sdcguard.checkpoint.dcp",
    "sdcguard.training.async_checkpoint": "sdcguard.checkpoint.asynchronous",
    "sdcguard.training.scrub": "sdcguard.checkpoint.scrub",
    "sdcguard.training.staging": "sdcguard.checkpoint.staging",
    "sdcguard.training.torchzip": "sdcguard.checkpoint.torchzip",
    "sdcguard.training.record": "sdcguard.checkpoint.record",
    "sdcguard.training.layout": "sdcguard.checkpoint.layout",
    "sdcguard.training.local_ranks": "sdcguard.testing.ranks",
    "sdcguard.fleet.schema": "sdcguard.fleet.store.schema.migrations",
    "sdcguard.fleet.connection": "sdcguard.fleet.store.core",
    "sdcguard.fleet.queries": "sdcguard.fleet.store.counts",
    "sdcguard.fleet.rows": "sdcguard.fleet.store.rows",
    "sdcguard.fleet.maintenance": "sdcguard.fleet.store.maintenance",
    "sdcguard.fleet.case_queries": "sdcguard.fleet.store.counts",
    "sdcguard.fleet.html": "sdcguard.fleet.report.html",
    "sdcguard.fleet.html_assets": "sdcguard.fleet.report.html_assets",
    "sdcguard.fleet.svg": "sdcguard.fleet.report.svg",
    "sdcguard.fleet.plot": "sdcguard.fleet.report.plot",
    "sdcguard.fleet.prometheus": "sdcguard.fleet.report.prometheus",
    "sdcguard.fleet.files": "sdcguard.fleet.report.files",
}
"""Module paths of release 0.1 that moved when the code was grouped by job -> where the module lives now. Importing
an old path still works for this release, with a ``DeprecationWarning``; the table goes with the next release."""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path of :data:`MOVED` and hands out the module at its new path (the same object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]}; the old path goes with the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed at its new path."""


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sdcguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
