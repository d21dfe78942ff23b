"""Telemetry snapshots taken before and after each device's scan, stored in the scan's meta.

A failing golden case next to a 95 C die, a throttled SM clock, a fresh double-bit ECC error or an XID says a lot
about the cause; without the snapshot that context is gone by the time anyone looks. Every reading is optional:
a counter the device or driver does not support is simply absent, never an error.

GPU (NVML): temperature, SM and memory clocks, power, volatile and aggregate ECC single-/double-bit counts,
retired pages, remapped rows, and the XID events delivered while the scan ran (NVML has no XID counter: a
:class:`GpuTelemetry` registers an event set at the first snapshot and drains it at the second).
CPU core (/proc, /sys): current frequency, the package or zone temperature where the kernel exposes one, and
the load average.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from typing import Any

from .discovery import ScanTarget, nvml

__all__ = ["Telemetry", "GpuTelemetry", "CpuTelemetry", "telemetry_for"]


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVML_ERROR_NOT_SUPPORTED, a missing /sys file, ...: the reading is just absent
        return None


class Telemetry:
    """Takes snapshots of one device; ``snapshot()`` returns a JSON-able dict (only the readings available)."""

    def snapshot(self) -> dict[str, Any]:
        return {"time": time.time()}

    def close(self) -> None:
        pass


class GpuTelemetry(Telemetry):
    def __init__(self, index: int) -> None:
        self._nvml = nvml()
        self._handle = None
        self._events = None
        if self._nvml is None:
            return
        n = self._nvml
        self._handle = n.nvmlDeviceGetHandleByIndex(index)
        # XIDs are events, not counters: listen for them from the first snapshot on.
        self._xids: list[int] = []
        events = _try(lambda: n.nvmlEventSetCreate())
        if events is not None:
            try:
                n.nvmlDeviceRegisterEvents(self._handle, n.nvmlEventTypeXidCriticalError, events)
                self._events = events
            except Exception:  # not supported on this board/driver: no XID readings
                _try(lambda: n.nvmlEventSetFree(events))

    def _drain_xids(self) -> list[int]:
        n = self._nvml
        if n is None or self._events is None:
            return []
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing pending
                break
            self._xids.append(int(data.eventData))
        return self._xids

    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        n, h = self._nvml, self._handle
        if n is None or h is None:
            return out
        readings: dict[str, Any] = {
            "temperature_c": _try(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "sm_clock_mhz": _try(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "mem_clock_mhz": _try(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            "power_w": _try(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            "utilization_pct": _try(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu),
            "ecc_sbe_volatile": _try(
                lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
            ),
            "ecc_dbe_volatile": _try(
                lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
            ),
            "ecc_sbe_aggregate": _try(
                lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC)
            ),
            "ecc_dbe_aggregate": _try(
                lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC)
            ),
            "retired_pages_sbe": _try(
                lambda: len(n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
            ),
            "retired_pages_dbe": _try(
                lambda: len(n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
            ),
        }
        rows = _try(lambda: n.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corr, unc, pending, failure = rows
            readings.update(
                remapped_rows_correctable=corr,
                remapped_rows_uncorrectable=unc,
                remap_pending=bool(pending),
                remap_failure=bool(failure),
            )
        if self._events is not None:
            readings["xids"] = list(self._drain_xids())
        out.update({k: v for k, v in readings.items() if v is not None})
        return out

    def close(self) -> None:
        nvml, events = self._nvml, self._events
        if nvml is not None and events is not None:
            _try(lambda: nvml.nvmlEventSetFree(events))
            self._events = None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class CpuTelemetry(Telemetry):
    def __init__(self, core: int) -> None:
        self._core = core

    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        khz = _read(f"/sys/devices/system/cpu/cpu{self._core}/cpufreq/scaling_cur_freq")
        if khz is not None and khz.isdigit():
            out["freq_mhz"] = int(khz) / 1000.0
        else:
            mhz = self._cpuinfo_mhz()
            if mhz is not None:
                out["freq_mhz"] = mhz
        temp = self._temperature()
        if temp is not None:
            out["temperature_c"] = temp
        load = _read("/proc/loadavg")
        if load:
            out["loadavg_1m"] = float(load.split()[0])
        return out

    def _cpuinfo_mhz(self) -> float | None:
        try:
            with open("/proc/cpuinfo") as f:
                current = -1
                for line in f:
                    if line.startswith("processor"):
                        current = int(line.split(":")[1])
                    elif line.startswith("cpu MHz") and current == self._core:
                        return float(line.split(":")[1])
        except (OSError, ValueError):
            pass
        return None

    def _temperature(self) -> float | None:
        # coretemp labels cores "Core N" (physical numbering, close enough for context); else the package or
        # the first thermal zone.
        for label_path in glob.glob("/sys/class/hwmon/hwmon*/temp*_label"):
            label = _read(label_path) or ""
            if label in (f"Core {self._core}", "Package id 0", "Tctl", "Tdie"):
                value = _read(label_path.replace("_label", "_input"))
                if value and value.lstrip("-").isdigit():
                    return int(value) / 1000.0
        value = _read("/sys/class/thermal/thermal_zone0/temp")
        if value and value.lstrip("-").isdigit():
            return int(value) / 1000.0
        return None


def telemetry_for(target: ScanTarget) -> Telemetry:
    """The telemetry source of a scan target (a bare timestamp for devices without any)."""
    if target.kind == "gpu":
        return GpuTelemetry(target.index)
    if target.kind == "cpu" and os.path.exists("/proc"):
        return CpuTelemetry(target.index)
    return Telemetry()
