"""Device identity: the one place that knows how a device id is spelled.

``GPU-<uuid>`` for NVIDIA GPUs, ``cpu:<hostname>:<core>`` for a CPU core, ``sim:<n>`` for a simulated device.
On the command line a device *spec* is ``cuda:N``, ``cpu:N``, a full device id, or ``all``.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .errors import BadInput

__all__ = [
    "DeviceKind",
    "DeviceSpec",
    "cpu_id",
    "gpu_id",
    "sim_id",
    "device_kind",
    "parse_device_id",
    "parse_spec",
    "hostname",
    "unknown_device",
]

DeviceKind = Literal["gpu", "cpu", "sim"]

_GPU_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_CPU_RE = re.compile(r"^cpu:(?P<host>[^:\s]+):(?P<core>\d+)$")
_SIM_RE = re.compile(r"^sim:(?P<n>\d+)$")


def hostname() -> str:
    """This machine's short host name, as it appears in CPU device ids."""
    return socket.gethostname().split(".")[0] or "localhost"


def gpu_id(uuid: str) -> str:
    """Device id of an NVIDIA GPU from its UUID, with or without the ``GPU-`` prefix (NVML gives it with)."""
    text = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    if not _GPU_RE.match(text):
        raise BadInput(f"not a GPU UUID: {uuid!r} (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return "GPU-" + text[4:].lower()


def cpu_id(core: int, host: str | None = None) -> str:
    """Device id of CPU core ``core`` on ``host`` (default: this machine)."""
    if core < 0:
        raise BadInput(f"CPU core must be >= 0, got {core}")
    return f"cpu:{host or hostname()}:{core}"


def sim_id(n: int) -> str:
    """Device id of simulated device ``n`` (the fleet simulator and tests)."""
    if n < 0:
        raise BadInput(f"simulated device number must be >= 0, got {n}")
    return f"sim:{n}"


def device_kind(device: str) -> DeviceKind:
    """The kind of a device id; ``BadInput`` if it is not one."""
    return parse_device_id(device)[0]


def parse_device_id(device: str) -> tuple[DeviceKind, str | None, str]:
    """Split a device id into ``(kind, host, local)``.

    ``local`` is the UUID for a GPU, the core number for a CPU core and the number for a simulated device.
    """
    if _GPU_RE.match(device):
        return "gpu", None, device[4:].lower()
    m = _CPU_RE.match(device)
    if m:
        return "cpu", m["host"], m["core"]
    m = _SIM_RE.match(device)
    if m:
        return "sim", None, m["n"]
    raise BadInput(f"not a device id: {device!r} (expected GPU-<uuid>, cpu:<host>:<core> or sim:<n>)")


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """A parsed command-line device spec."""

    kind: Literal["all", "cuda", "cpu", "id"]
    """``all``; ``cuda`` or ``cpu`` with an ``index``; or ``id`` with a full device id."""
    index: int | None = None
    device: str | None = None


def parse_spec(text: str) -> DeviceSpec:
    """Parse ``cuda:N``, ``cpu:N``, a full device id, or ``all``."""
    t = text.strip()
    if t == "all":
        return DeviceSpec(kind="all")
    m = re.match(r"^(cuda|cpu):(\d+)$", t)
    if m:
        return DeviceSpec(kind="cuda" if m[1] == "cuda" else "cpu", index=int(m[2]))
    try:
        parse_device_id(t)
    except BadInput:
        raise BadInput(
            f"bad device spec {text!r}: use cuda:N, cpu:N, a device id (GPU-<uuid>, cpu:<host>:<core>, sim:<n>) or all"
        ) from None
    return DeviceSpec(kind="id", device=t if not t.startswith("GPU-") else gpu_id(t))


def unknown_device(device: str, known: Sequence[str], *, what: str, hint: str = "") -> BadInput:
    """The error for a device id the store has never seen: ``what`` failed, the closest known ids (a typo is
    the usual cause), and ``hint`` (how to proceed anyway, if there is a way)."""
    import difflib

    near = difflib.get_close_matches(device, list(known), n=3, cutoff=0.6)
    did_you_mean = (
        f"; did you mean {' or '.join(near)}?"
        if near
        else (
            "; the store knows no device yet"
            if not known
            else f"; it knows {len(known)} device(s), see `sdcguard report`"
        )
    )
    return BadInput(f"{what}: {device} is not a device this store has seen{did_you_mean}{hint}")
