"""The scanner's configuration: one frozen dataclass handed from the command line to every per-device worker process.

It is the one definition of the scan's settings. A field a user may set (a *setting*) carries its key (the
``[scan]`` key of the config file and the name of the command-line option, ``--`` and the key with dashes) and what
it expects, in words; its default is the field's default and its rules live in ``__post_init__``. The config
file's checks (:mod:`fleet_scan.config`) and the command's options and defaults (:mod:`fleet_scan.command`) are
derived from these fields, as the ``[policy]`` keys are from :class:`~sdcguard.fleet.policy.QuarantinePolicy`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from sdcguard.durations import parse_seconds
from sdcguard.errors import BadInput
from sdcguard.inject.spec import InjectSpec

from .devices.idle import DEFAULT_CPU_BUSY_MAX, DEFAULT_GPU_UTIL_MAX, DEFAULT_WINDOW_S

__all__ = ["ScanOptions", "DEFAULT_BUDGET_S", "DEFAULT_RETESTS", "settings", "setting_kind", "setting_value"]

DEFAULT_BUDGET_S = 60.0
"""Per-device budget of a scan: a minute a day finds a device failing one execution in a thousand within a day
(see ``benchmarks/fleet_policy.py``) and costs a GPU node less than 0.1% of its time."""
DEFAULT_RETESTS = 3
"""Retests of a failing case, in a fresh process, to tell a transient from a sticky fault."""


def _setting(default: Any, key: str, expects: str, *, duration: bool = False) -> Any:
    return field(default=default, metadata={"key": key, "expects": expects, "duration": duration})


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """How each device is scanned (everything a worker process needs besides its device)."""

    db: str
    """Path of the fleet store."""
    budget_s: float | None = _setting(
        DEFAULT_BUDGET_S, "budget", "a positive duration: seconds or a number and a unit, e.g. 60 or 5m", duration=True
    )
    """Wall-clock seconds per device, from the scan's start to its final record; None: one pass over the suite."""
    retests: int = _setting(DEFAULT_RETESTS, "retests", "a whole number >= 0, e.g. 3")
    """Retests of a failing case in a fresh process (0: no retest; the failure's ``sticky`` stays None)."""
    inject: InjectSpec | None = None
    """The fire drill, parsed once where it was given (:meth:`~sdcguard.inject.spec.InjectSpec.parse`); every
    worker and retest gets the parsed value; None in production."""
    only_idle: bool = _setting(True, "only_idle", "true or false")
    """Scan only idle devices and stop (``preempted``) when a job appears; False scans whatever is asked."""
    idle_window_s: float = _setting(
        DEFAULT_WINDOW_S, "idle_window", "a duration >= 0: seconds or a number and a unit, e.g. 1 or 2s", duration=True
    )
    """Window of the idle check before a scan."""
    gpu_util_max: float = _setting(DEFAULT_GPU_UTIL_MAX, "gpu_util_max", "a percentage 0..100, e.g. 5")
    """A GPU above this utilization (%) over the window is busy."""
    cpu_busy_max: float = _setting(DEFAULT_CPU_BUSY_MAX, "cpu_busy_max", "a percentage 0..100, e.g. 50")
    """A CPU core kept busier than this (%) by other processes is busy."""
    lock_dir: str | None = _setting(None, "lock_dir", "a directory path (a string)")
    """Directory of the per-device lock files (default: :func:`fleet_scan.devices.idle.default_lock_dir`)."""
    golden_dir: str | None = _setting(None, "golden_dir", "a directory path (a string)")
    """Golden data directory (default: the one shipped with sdcguard)."""
    json: bool = False
    """Progress as JSON lines even on a terminal."""

    def __post_init__(self) -> None:
        if self.inject is not None and not isinstance(self.inject, InjectSpec):
            raise TypeError(f"inject must be a parsed InjectSpec (InjectSpec.parse(text)), got {self.inject!r}")
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

    @classmethod
    def from_settings(
        cls, given: typing.Mapping[str, Any], section: typing.Mapping[str, Any], **others: Any
    ) -> ScanOptions:
        """The options of a scan: each setting from ``given`` (the command line and environment, by key; None: not
        given), else the config file's ``[scan]`` section, else its default; ``others``: the fields that are not
        settings (``db``, ``inject``, ``json``)."""
        values = {}
        for key, f in settings().items():
            value = given.get(key)
            if value is None:
                value = section.get(key)
            if value is not None:
                values[f.name] = setting_value(f, value)
        return cls(**others, **values)

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON values; the fire drill as its parsed rules (:meth:`InjectSpec.to_json`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["inject"] = None if self.inject is None else self.inject.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanOptions:
        """The options :meth:`to_json` wrote (in a worker or a retest): the fire drill is rebuilt, never re-parsed."""
        inject = data.get("inject")
        return cls(**{**data, "inject": None if inject is None else InjectSpec.from_json(inject)})


def settings() -> dict[str, dataclasses.Field[Any]]:
    """The fields a user may set, by key (``[scan]`` key and command-line option)."""
    return {f.metadata["key"]: f for f in dataclasses.fields(ScanOptions) if "key" in f.metadata}


def setting_kind(f: dataclasses.Field[Any]) -> type:
    """The type a setting's value has (``float``, ``int``, ``bool`` or ``str``; None aside)."""
    hint = typing.get_type_hints(ScanOptions)[f.name]
    (kind,) = [k for k in typing.get_args(hint) or (hint,) if k is not type(None)]
    assert kind in (float, int, bool, str), (f.name, kind)
    value_type: type = kind
    return value_type


def setting_value(f: dataclasses.Field[Any], value: Any) -> Any:
    """A setting's value as its field holds it: a duration's text (``5m``) or number in seconds
    (:func:`~sdcguard.durations.parse_seconds`; :class:`BadInput` names the key), anything else of its type."""
    if f.metadata.get("duration"):
        return parse_seconds(value, option=f"--{f.metadata['key'].replace('_', '-')}", zero=True)
    return setting_kind(f)(value)
