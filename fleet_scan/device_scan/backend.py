"""What a device's scan and a retest of it both set up in their own process: the suite, the backend, the drill hook.

A worker (:mod:`fleet_scan.device_scan.worker`) and a retest (:mod:`fleet_scan.device_scan.retest`) run the same
cases the same way on the same device, so they build these three the same way: from here, and from nothing the other
one holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sdcguard.errors import SuiteError
from sdcguard.inject.spec import InjectionHook, InjectSpec

from ..devices.discovery import ScanTarget
from ..options import ScanOptions

__all__ = ["make_backend", "make_hook", "load_worker_suite"]


def make_backend(target: ScanTarget, suite: Any = None) -> Any:
    """The golden-suite backend of a target: numpy pinned to the core, or CuPy on the GPU."""
    if target.kind == "cpu":
        from sdcguard.golden import NumpyBackend

        return NumpyBackend(target.index, suite=suite)
    if target.kind == "gpu":
        try:
            from sdcguard.golden import CupyBackend
        except ImportError as e:
            raise SuiteError(f"{target.device}: this sdcguard has no CUDA golden-suite backend ({e})") from None
        # The worker's environment makes the target the only visible CUDA device (CUDA_VISIBLE_DEVICES=<uuid>):
        # NVML and CUDA may number GPUs differently, the UUID is unambiguous.
        return CupyBackend(0, suite=suite)
    raise SuiteError(f"{target.device}: no golden-suite backend for {target.kind} devices")


def make_hook(drill: InjectSpec | None, target: ScanTarget) -> InjectionHook | None:
    """The fire-drill output hook for a target (None without ``--inject`` or when no rule names it)."""
    if drill is None:
        return None
    # cuda:N in a rule means the GPU that `--device cuda:N` selects: NVML index N.
    return drill.hook(target.device, cuda_index=target.index if target.kind == "gpu" else None)


def load_worker_suite(options: ScanOptions, references: str | None) -> Any:
    """The suite a worker (or a retest) runs: the references its parent built off this device when it handed
    them over (nothing is computed or hashed here, see :mod:`sdcguard.golden.references`), else the golden data
    loaded and checked here (a worker started by hand)."""
    if references:
        from sdcguard.golden.references import load_references

        return load_references(Path(references))
    from sdcguard.golden import load_suite

    return load_suite(None if options.golden_dir is None else Path(options.golden_dir))
