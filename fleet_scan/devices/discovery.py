"""Which devices this machine has, and which of them a scan was asked for.

GPUs come from NVML (``nvidia-ml-py``, imported lazily: a CPU node never needs it); CPU cores from the
process's affinity mask, so a scanner started under ``taskset`` or a cgroup cpuset only sees its own cores.
Without ``--device`` a scan covers every GPU, or every CPU core where there is no GPU.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sdcguard.devices import cpu_id, gpu_id, hostname, parse_device_id, parse_spec
from sdcguard.errors import NoDevice
from sdcguard.records import DeviceInfo

__all__ = ["ScanTarget", "discover_gpus", "discover_cpus", "select_targets", "nvml", "open_nvml"]


@dataclass(frozen=True, kw_only=True)
class ScanTarget:
    """One device a scan will run on."""

    info: DeviceInfo
    index: int
    """NVML index of a GPU, or the core number of a CPU core."""
    driver: str | None = None
    """NVIDIA driver version (GPUs only)."""

    @property
    def device(self) -> str:
        return self.info.id

    @property
    def kind(self) -> Literal["gpu", "cpu", "sim"]:
        return self.info.kind

    def to_json(self) -> dict[str, Any]:
        return {"info": dataclasses.asdict(self.info), "index": self.index, "driver": self.driver}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanTarget:
        return cls(info=DeviceInfo(**data["info"]), index=int(data["index"]), driver=data.get("driver"))


def open_nvml() -> tuple[Any | None, str | None]:
    """``(the initialised pynvml module, None)``, or ``(None, why not)`` where NVML (the package, the library or
    a driver) cannot be opened: the idle check needs the reason, discovery only whether."""
    try:
        import pynvml
    except ImportError as e:
        return None, f"the NVML Python package is not installed ({e})"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission, ...
        return None, f"NVML cannot be opened: {e or type(e).__name__}"
    return pynvml, None


def nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None where NVML (the package, the library or a driver) is missing."""
    return open_nvml()[0]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpus() -> list[ScanTarget]:
    """Every NVIDIA GPU NVML sees, in NVML index order (empty where there is no NVML)."""
    pynvml = nvml()
    if pynvml is None:
        return []
    host = hostname()
    try:
        driver: str | None = _text(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        driver = None
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(pynvml.nvmlDeviceGetUUID(h))
        try:
            serial: str | None = _text(pynvml.nvmlDeviceGetSerial(h))
        except Exception:  # consumer boards have no serial (NVML_ERROR_NOT_SUPPORTED)
            serial = None
        try:
            pci: str | None = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
        except Exception:
            pci = None
        try:
            model: str | None = _text(pynvml.nvmlDeviceGetName(h))
        except Exception:
            model = None
        try:
            did = gpu_id(uuid)
        except Exception:  # MIG instances have MIG-<uuid>: not scanned as whole GPUs
            continue
        info = DeviceInfo(id=did, host=host, kind="gpu", model=model, serial=serial, pci_bus_id=pci, index=i)
        out.append(ScanTarget(info=info, index=i, driver=driver))
    return out


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def discover_cpus() -> list[ScanTarget]:
    """Every CPU core this process may run on (its affinity mask), in core order."""
    host = hostname()
    model = _cpu_model()
    return [
        ScanTarget(info=DeviceInfo(id=cpu_id(core, host), host=host, kind="cpu", model=model, index=core), index=core)
        for core in sorted(os.sched_getaffinity(0))
    ]


def select_targets(
    specs: Sequence[str] = (), *, gpus: Sequence[ScanTarget] | None = None, cpus: Sequence[ScanTarget] | None = None
) -> list[ScanTarget]:
    """The devices named by ``specs`` (``cuda:N``, ``cpu:N``, a device id, ``all``), without duplicates.

    No spec: every GPU, or every CPU core where there is no GPU. ``all``: every GPU and every CPU core.
    ``gpus``/``cpus`` replace discovery (tests). Raises :class:`NoDevice` naming the spec nothing matched.
    """
    gpu_list = list(discover_gpus() if gpus is None else gpus)
    cpu_list = list(discover_cpus() if cpus is None else cpus)
    if not specs:
        chosen = gpu_list or cpu_list
        if not chosen:
            raise NoDevice("no GPU and no CPU core available to scan")
        return chosen
    out: dict[str, ScanTarget] = {}
    host = hostname()
    for text in specs:
        spec = parse_spec(text)
        if spec.kind == "all":
            matched = gpu_list + cpu_list
        elif spec.kind == "cuda":
            matched = [t for t in gpu_list if t.index == spec.index]
            if not matched:
                raise NoDevice(f"no GPU cuda:{spec.index} on this machine ({len(gpu_list)} GPU(s) found through NVML)")
        elif spec.kind == "cpu":
            matched = [t for t in cpu_list if t.index == spec.index]
            if not matched:
                cores = ",".join(str(t.index) for t in cpu_list)
                raise NoDevice(f"no CPU core cpu:{spec.index} available to this process (cores: {cores})")
        else:
            assert spec.device is not None
            kind, dev_host, _ = parse_device_id(spec.device)
            if kind == "sim":
                raise NoDevice(
                    f"{spec.device} is a simulated device: they exist only in the fleet simulator (fleet_scan.sim)"
                )
            if kind == "cpu" and dev_host != host:
                raise NoDevice(f"{spec.device} is a CPU core of host {dev_host!r}, not of this host ({host!r})")
            matched = [t for t in gpu_list + cpu_list if t.device == spec.device]
            if not matched:
                raise NoDevice(f"no device {spec.device} on this machine")
        for t in matched:
            out.setdefault(t.device, t)
    if not out:
        raise NoDevice("no device matched " + " ".join(specs))
    return list(out.values())
