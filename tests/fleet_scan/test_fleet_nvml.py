"""GPU discovery, telemetry and idle detection against a stand-in NVML (no GPU on CI machines).

The stand-in implements the pynvml calls the scanner makes with the same names and signatures, and raises
``NVMLError`` for what a board does not support, as the real library does.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import pytest

from fleet_scan.devices import discovery
from fleet_scan.devices.discovery import discover_gpus, select_targets
from fleet_scan.devices.idle import IdleMonitor
from fleet_scan.devices.telemetry import GpuTelemetry
from sdcguard.fleet.nvml import nvml_text
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo

_UUIDS = ["GPU-0badc0de-1111-2222-3333-444455556666", "GPU-0badc0de-1111-2222-3333-444455557777"]


class NVMLError(Exception):
    pass


def _fake_nvml(*, processes: dict[int, list[int]] | None = None, util: int = 0, xids: list[int] | None = None) -> Any:
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    for i, name in enumerate(
        [
            "NVML_TEMPERATURE_GPU",
            "NVML_CLOCK_SM",
            "NVML_CLOCK_MEM",
            "NVML_MEMORY_ERROR_TYPE_CORRECTED",
            "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
            "NVML_VOLATILE_ECC",
            "NVML_AGGREGATE_ECC",
            "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
            "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
            "nvmlEventTypeXidCriticalError",
        ]
    ):
        setattr(m, name, i)
    pending = list(xids or [])
    m.nvmlInit = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlDeviceGetCount = lambda: len(_UUIDS)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: _UUIDS[h]

    def serial(h: int) -> str:
        if h == 1:
            raise NVMLError("Not Supported")
        return "1652823054321"

    m.nvmlDeviceGetSerial = serial
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0")
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetTemperature = lambda h, sensor: 41 + h
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980 if clock == m.NVML_CLOCK_SM else 2619
    m.nvmlDeviceGetPowerUsage = lambda h: 118_000
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util, memory=0)
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 3 if kind == m.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def retired(h: int, cause: int) -> list[int]:
        raise NVMLError("Not Supported")  # HBM boards remap rows instead

    m.nvmlDeviceGetRetiredPages = retired
    m.nvmlDeviceGetRemappedRows = lambda h: (2, 0, 0, 0)
    m.nvmlEventSetCreate = lambda: "events"
    m.nvmlDeviceRegisterEvents = lambda h, kinds, events: None

    def wait(events: str, timeout_ms: int) -> Any:
        if not pending:
            raise NVMLError("Timeout")
        return types.SimpleNamespace(eventData=pending.pop(0))

    m.nvmlEventSetWait_v2 = wait
    m.nvmlEventSetFree = lambda events: None
    procs = processes or {}
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=p) for p in procs.get(h, [])]
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return m


def _install(monkeypatch: pytest.MonkeyPatch, fake: Any) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)


def test_gpus_are_found_with_their_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _fake_nvml())
    gpus = discover_gpus()
    assert [g.device for g in gpus] == _UUIDS
    assert gpus[0].info.serial == "1652823054321" and gpus[1].info.serial is None
    assert gpus[1].info.pci_bus_id == "00000000:19:00.0" and gpus[0].info.model == "NVIDIA H200"
    assert gpus[0].driver == "550.54.15" and [g.index for g in gpus] == [0, 1]
    # with GPUs present, the default scan is the GPUs, not the CPU cores
    assert select_targets([]) == gpus
    assert select_targets(["cuda:1"]) == [gpus[1]]


def test_no_nvml_means_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml()

    def broken() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    fake.nvmlInit = broken
    _install(monkeypatch, fake)
    assert discover_gpus() == []
    assert discovery.nvml() is None


def test_gpu_telemetry_reads_what_the_board_has_and_the_xids_in_between(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml(xids=[79])
    _install(monkeypatch, fake)
    tel = GpuTelemetry(0)
    snap = tel.snapshot()
    assert snap["temperature_c"] == 41 and snap["sm_clock_mhz"] == 1980 and snap["mem_clock_mhz"] == 2619
    assert snap["power_w"] == 118.0 and snap["ecc_sbe_volatile"] == 3 and snap["ecc_dbe_volatile"] == 0
    assert snap["remapped_rows_correctable"] == 2 and snap["remap_failure"] is False
    assert "retired_pages_sbe" not in snap  # not supported: absent, not an error
    assert snap["xids"] == [79]
    tel.close()


def test_the_snapshots_the_scanner_keeps_are_what_the_store_reads_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The telemetry the scanner takes before and after a scan, kept in its meta as the worker keeps it, reads back
    as NVML's opinion of the GPU: the XID delivered in between and the double-bit ECC errors counted meanwhile."""
    fake = _fake_nvml()
    _install(monkeypatch, fake)
    tel = GpuTelemetry(0)
    before = tel.snapshot()
    fake.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: (
        3 if kind == fake.NVML_MEMORY_ERROR_TYPE_CORRECTED else 2
    )
    fake.nvmlEventSetWait_v2 = _events([79])
    after = tel.snapshot()
    tel.close()
    with Store.open(tmp_path / "f.db") as store:
        store.scans.record_devices([DeviceInfo(id=_UUIDS[0], host="node1", kind="gpu", index=0)])
        sid = store.scans.begin(device=_UUIDS[0], host="node1", budget_s=60.0, meta={"telemetry_before": before})
        store.scans.record(sid, (), finish="error", meta={"telemetry_after": after})
        got = store.hardware.latest()[_UUIDS[0]]
    assert got.xids == (79,) and got.dbe_growth == 2 and got.remapped_rows_correctable == 2
    assert nvml_text(got) == "xid 79, dbe +2"


def _events(xids: list[int]) -> Any:
    pending = list(xids)

    def wait(events: str, timeout_ms: int) -> Any:
        if not pending:
            raise NVMLError("Timeout")
        return types.SimpleNamespace(eventData=pending.pop(0))

    return wait


def test_a_gpu_with_a_job_is_busy_and_its_appearance_preempts(monkeypatch: pytest.MonkeyPatch) -> None:
    procs: dict[int, list[int]] = {0: [4242], 1: []}
    _install(monkeypatch, _fake_nvml(processes=procs))
    gpus = discover_gpus()
    busy = IdleMonitor(gpus[0], window_s=0.05).busy_reason()
    assert busy is not None and "4242" in busy
    monitor = IdleMonitor(gpus[1], window_s=0.05)
    assert monitor.busy_reason() is None
    procs[1].append(os.getpid())  # the scanner's own CUDA context is not a job
    assert monitor.job_appeared() is None
    procs[1].append(5151)
    reason = monitor.job_appeared()
    assert reason is not None and "5151" in reason


def test_a_busy_gpu_without_processes_is_busy_by_utilization(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _fake_nvml(util=87))
    gpu = discover_gpus()[0]
    reason = IdleMonitor(gpu, window_s=0.05, gpu_util_max=5).busy_reason()
    assert reason is not None and "87%" in reason


# --- fail safe: a device is idle only when it was measured idle ---------------------------------------------------
_IDLE_CALLS = [
    "nvmlInit",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetUtilizationRates",
]


def _raising(message: str) -> Any:
    def call(*args: Any) -> Any:
        raise NVMLError(message)

    return call


@pytest.mark.parametrize("call", _IDLE_CALLS)
def test_each_nvml_call_that_raises_makes_the_gpu_busy_with_the_error(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    _install(monkeypatch, _fake_nvml())
    gpu = discover_gpus()[0]
    setattr(__import__("sys").modules["pynvml"], call, _raising("Insufficient Permissions"))
    monitor = IdleMonitor(gpu, window_s=0.05)
    reason = monitor.busy_reason()
    assert reason is not None and "busy" in reason and "Insufficient Permissions" in reason
    assert monitor.error is not None and "Insufficient Permissions" in monitor.error


@pytest.mark.parametrize("call", ["nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"])
def test_a_process_list_that_fails_between_cases_stops_the_scan(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    _install(monkeypatch, _fake_nvml())
    monitor = IdleMonitor(discover_gpus()[0], window_s=0.05)
    assert monitor.busy_reason() is None
    setattr(__import__("sys").modules["pynvml"], call, _raising("Unknown Error"))
    reason = monitor.job_appeared()
    assert reason is not None and "Unknown Error" in reason


def test_a_gpu_without_nvml_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _fake_nvml())
    gpu = discover_gpus()[0]
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # `import pynvml` raises ImportError
    reason = IdleMonitor(gpu, window_s=0.05).busy_reason()
    assert reason is not None and "not installed" in reason


def test_utilization_not_supported_falls_back_to_the_process_list(monkeypatch: pytest.MonkeyPatch) -> None:
    procs: dict[int, list[int]] = {0: []}
    fake = _fake_nvml(processes=procs)
    fake.nvmlDeviceGetUtilizationRates = _raising("Not Supported")  # a MIG instance
    _install(monkeypatch, fake)
    gpu = discover_gpus()[0]
    assert IdleMonitor(gpu, window_s=0.05).busy_reason() is None  # not busy for ever
    procs[0].append(4242)
    reason = IdleMonitor(gpu, window_s=0.05).busy_reason()
    assert reason is not None and "4242" in reason


def test_a_gpu_where_nothing_can_be_measured_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml()
    fake.nvmlDeviceGetUtilizationRates = _raising("Not Supported")
    fake.nvmlDeviceGetComputeRunningProcesses = _raising("Not Supported")
    _install(monkeypatch, fake)
    reason = IdleMonitor(discover_gpus()[0], window_s=0.05).busy_reason()
    assert reason is not None and "neither" in reason


def test_a_gpu_that_cannot_be_measured_is_skipped_with_the_error_in_the_summary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from fleet_scan.device_scan.worker import scan_device
    from fleet_scan.events import Event
    from fleet_scan.options import ScanOptions

    fake = _fake_nvml()
    fake.nvmlDeviceGetComputeRunningProcesses = _raising("Driver/library version mismatch")
    _install(monkeypatch, fake)
    gpu = discover_gpus()[0]
    options = ScanOptions(db=str(tmp_path / "s.db"), budget_s=1.0, lock_dir=str(tmp_path / "locks"), idle_window_s=0.05)
    events: list[Event] = []
    summary = scan_device(gpu, options, events.append)
    assert summary.status == "busy" and summary.idle_error is not None and "version mismatch" in summary.idle_error
    assert summary.reason is not None and "version mismatch" in summary.reason
    assert events[-1] == summary and events[-1].to_json()["idle_error"] == summary.idle_error
    assert not (tmp_path / "s.db").exists()  # nothing ran, nothing was recorded


def test_a_core_that_cannot_be_measured_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_scan.devices import idle

    core = discovery.discover_cpus()[0]

    def unreadable(stat_text: str | None = None) -> dict[int, tuple[int, int]]:
        raise PermissionError("permission denied: /proc/stat")

    monkeypatch.setattr(idle, "read_cpu_times", unreadable)
    monitor = IdleMonitor(core, window_s=0.01)
    reason = monitor.busy_reason()
    assert reason is not None and "/proc/stat" in reason and monitor.error is not None
    monkeypatch.setattr(idle, "read_cpu_times", lambda stat_text=None: {})  # the core is not listed
    reason = IdleMonitor(core, window_s=0.01).busy_reason()
    assert reason is not None and "not listed" in reason
