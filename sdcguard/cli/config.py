"""The TOML config file of ``scan`` and ``policy``: every value checked once, when the file is read.

A wrong value is one line naming the file, the section and key, what it holds and what is expected (exit 2),
never a ``ValueError`` from deep inside the scanner. The ``[scan]`` keys and their checks live here, in one table;
the ``[policy]`` keys are the fields of :class:`~sdcguard.fleet.policy.QuarantinePolicy`, checked by their types
and then by the policy's own rules.
"""

from __future__ import annotations

import math
import tomllib
import typing
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import BadInput

__all__ = ["SCAN_KEYS", "read_config"]


def _number(lo: float, hi: float = math.inf, *, lo_open: bool = False) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return False
        return (v > lo if lo_open else v >= lo) and v <= hi
    return ok


def _int_at_least(lo: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


SCAN_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "budget": (_number(0, lo_open=True), "a positive number of seconds, e.g. 60"),
    "retests": (_int_at_least(0), "a whole number >= 0, e.g. 3"),
    "only_idle": (lambda v: isinstance(v, bool), "true or false"),
    "actions": (_strings, 'a list of command-line strings, e.g. ["slurm-drain"]'),
    "lock_dir": (lambda v: isinstance(v, str) and bool(v), "a directory path (a string)"),
    "golden_dir": (lambda v: isinstance(v, str) and bool(v), "a directory path (a string)"),
    "idle_window": (_number(0), "a number of seconds >= 0, e.g. 1.0"),
    "gpu_util_max": (_number(0, 100), "a percentage 0..100, e.g. 5"),
    "cpu_busy_max": (_number(0, 100), "a percentage 0..100, e.g. 50"),
    "devices": (_strings, 'a list of device specs, e.g. ["cuda:0", "cpu:3"]'),
    "policy_scope": (lambda v: v in ("fleet", "node"), '"fleet" or "node"'),
}
"""Every ``[scan]`` key: its check and what it expects, in words."""


def read_config(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``, every value checked; :class:`BadInput` names the first wrong one."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise BadInput(f"cannot read config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"config {path} is not valid TOML: {e}") from None
    unknown = set(data) - {"scan", "policy"}
    if unknown:
        raise BadInput(f"config {path}: unknown section(s) {sorted(unknown)}; use [scan] and [policy]")
    for name in ("scan", "policy"):
        if name in data and not isinstance(data[name], dict):
            raise BadInput(f"config {path}: {name} must be a [{name}] section, got {data[name]!r}")
    _check_scan(path, data.get("scan", {}))
    _check_policy(path, data.get("policy", {}))
    return data


def _check_scan(path: Path, section: dict[str, Any]) -> None:
    unknown = set(section) - set(SCAN_KEYS)
    if unknown:
        raise BadInput(f"config {path}: [scan] unknown key(s) {sorted(unknown)}; known: {sorted(SCAN_KEYS)}")
    for key, value in section.items():
        check, expected = SCAN_KEYS[key]
        if not check(value):
            raise BadInput(f"config {path}: [scan] {key} = {value!r}: expected {expected}")


def _check_policy(path: Path, section: dict[str, Any]) -> None:
    from ..fleet.policy import QuarantinePolicy

    hints = typing.get_type_hints(QuarantinePolicy)
    known = {f.name for f in fields(QuarantinePolicy)}
    unknown = set(section) - known
    if unknown:
        raise BadInput(f"config {path}: [policy] unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    for key, value in section.items():
        kind = hints[key]
        if kind is bool:
            ok, expected = isinstance(value, bool), "true or false"
        elif kind is int:
            ok, expected = _int_at_least(-(2**63))(value), "a whole number"
        else:
            ok, expected = _number(-math.inf)(value), "a number"
        if not ok:
            raise BadInput(f"config {path}: [policy] {key} = {value!r}: expected {expected}")
    try:
        QuarantinePolicy(**section)
    except (TypeError, ValueError) as e:
        raise BadInput(f"config {path}: [policy] {e}") from None
