"""Section ``nvml``: what the fleet scanner learns from NVML, on a real driver.

- Discovery (``fleet_scan.devices.discovery``): NVML finds the GPUs, and ``cuda:0`` is one of them under the same device
  id the CUDA backend computes from the CUDA properties (``select_targets(["cuda:0"])`` picks it).
- Idle detection (``fleet_scan.devices.idle.IdleMonitor``): the idle GPU reads as idle; with a load running in another
  process (a matmul loop) ``busy_reason()`` says busy, and ``job_appeared()`` (processes only, between cases) sees
  the load's process.
- Telemetry (``fleet_scan.devices.telemetry.GpuTelemetry``): the snapshot holds the ECC error counters, the
  remapped-rows counts and the XID event list (the event set registered), besides temperature and clocks. Where a field
  is missing, the NVML call behind it is made directly and its error recorded, so the log says why.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from .context import Context
from .results import SectionReport

__all__ = ["run", "check_nvml", "gpu_load", "nvml_probes", "REQUIRED_TELEMETRY", "LOAD_SECONDS"]

REQUIRED_TELEMETRY: dict[str, tuple[str, ...]] = {
    "ECC error counters": ("ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate"),
    "remapped rows": ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure"),
    "XID events": ("xids",),
    "temperature and clocks": ("temperature_c", "sm_clock_mhz", "mem_clock_mhz"),
}

LOAD_SECONDS = 20.0
"""Longest the load process runs (it is stopped as soon as the checks are done)."""

_LOAD = r"""
import sys, time
import cupy as cp
seconds, device = float(sys.argv[1]), int(sys.argv[2])
with cp.cuda.Device(device):
    a = cp.ones((4096, 4096), dtype=cp.float32)
    end = time.monotonic() + seconds
    ready = False
    while time.monotonic() < end:
        for _ in range(8):
            a @ a
        cp.cuda.Device(device).synchronize()
        if not ready:
            print("ready", flush=True)
            ready = True
"""


@contextlib.contextmanager
def gpu_load(index: int, *, wait_s: float = 30.0) -> Iterator[int]:
    """A matmul loop on GPU ``index`` in another process, running while the block runs; yields its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOAD, str(LOAD_SECONDS), str(index)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], wait_s)
        if not ready or proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the GPU load process did not start within {wait_s:.0f} s (exit {proc.poll()})")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def nvml_probes(n: Any, h: Any) -> dict[str, str]:
    """Each NVML call behind a telemetry group, made directly: ``ok: <value>`` or the error NVML raised."""

    def xid() -> str:
        events = n.nvmlEventSetCreate()
        try:
            n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, events)
        finally:
            n.nvmlEventSetFree(events)
        return "registered"

    calls: dict[str, Callable[[], Any]] = {
        "ECC mode (current, pending)": lambda: n.nvmlDeviceGetEccMode(h),
        "ECC error counters": lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
        ),
        "remapped rows": lambda: n.nvmlDeviceGetRemappedRows(h),
        "XID events": xid,
        "compute processes": lambda: [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
    }
    out = {}
    for label, call in calls.items():
        try:
            out[label] = f"ok: {call()}"
        except Exception as e:
            out[label] = f"{type(e).__name__}: {e}"
    return out


def check_nvml(
    rep: SectionReport, index: int, cuda_device: str, start_load: Callable[[], AbstractContextManager[int]]
) -> dict[str, Any]:
    """Every check of the module docstring for the GPU CUDA calls ``index`` with device id ``cuda_device``."""
    from fleet_scan.devices.discovery import discover_gpus, nvml, select_targets
    from fleet_scan.devices.idle import IdleMonitor
    from fleet_scan.devices.telemetry import GpuTelemetry

    gpus = discover_gpus()
    rep.check(
        "NVML finds the GPUs",
        bool(gpus),
        "; ".join(f"{t.index}: {t.info.model} {t.device} pci {t.info.pci_bus_id} driver {t.driver}" for t in gpus),
    )
    mine = [t for t in gpus if t.device == cuda_device]
    if not rep.check(f"cuda:{index} is an NVML GPU under the same device id", len(mine) == 1, cuda_device):
        return {"gpus": [t.to_json() for t in gpus]}
    picked = select_targets([f"cuda:{index}"])
    rep.check(
        f"select_targets(['cuda:{index}']) picks it",
        [t.device for t in picked] == [cuda_device],
        str([t.device for t in picked]),
    )
    target = mine[0]
    n = nvml()
    h = n.nvmlDeviceGetHandleByIndex(target.index)
    telemetry = GpuTelemetry(target.index)
    monitor = IdleMonitor(target)
    before = telemetry.snapshot()
    idle = monitor.busy_reason()
    rep.check("the idle GPU reads as idle", idle is None, idle or f"utilization {before.get('utilization_pct')}%")
    with start_load() as pid:
        busy = monitor.busy_reason()
        rep.check("with a load in another process the GPU reads as busy", busy is not None, busy or "idle")
        listed = nvml_probes(n, h)["compute processes"]
        appeared = monitor.job_appeared()
        rep.check(
            "job_appeared() sees the load's process between cases",
            appeared is not None and str(pid) in appeared,
            f"{appeared or 'nothing'}; the load is pid {pid}, NVML lists {listed}",
        )
        under_load = telemetry.snapshot()
    after = telemetry.snapshot()
    telemetry.close()
    for group, fields in REQUIRED_TELEMETRY.items():
        missing = [f for f in fields if f not in after]
        rep.check(
            f"telemetry holds the {group}",
            not missing,
            f"missing {missing}" if missing else ", ".join(f"{f}={after[f]}" for f in fields),
        )
    probes = nvml_probes(n, h)
    for label, said in probes.items():
        rep.say(f"  nvml {label}: {said}")
    return {
        "gpus": [t.to_json() for t in gpus],
        "idle_reason": idle,
        "busy_reason": busy,
        "job_appeared": appeared,
        "telemetry_idle": before,
        "telemetry_under_load": under_load,
        "telemetry_after": after,
        "probes": probes,
    }


def run(ctx: Context, rep: SectionReport) -> str:
    try:
        import pynvml

        ok, detail = True, f"nvidia-ml-py {getattr(pynvml, '__version__', '')}".strip()
    except ImportError as e:
        ok, detail = False, str(e)
    rep.check("pynvml imports", ok, detail)
    ctx.require_gpu(
        "discover the GPUs through NVML, check idle detection against a load in another process and "
        "read the XID/ECC/remapped-rows telemetry"
    )
    from sdcguard.golden import CupyBackend

    cuda_device = CupyBackend(ctx.device).device  # the device id from the CUDA properties (no allocation)
    m = rep.measure("nvml", check_nvml(rep, ctx.device, cuda_device, lambda: gpu_load(ctx.device)))
    return (
        f"{len(m['gpus'])} GPU(s) found; idle and busy told apart ({m.get('busy_reason')}); XID, ECC and "
        f"remapped-rows telemetry read"
    )
