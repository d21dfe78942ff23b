"""The TOML config file of ``scan``, ``policy`` and ``report``: every value checked once, when the file is read.

A wrong value is one line naming the file, the section and key, what it holds and what is expected (exit 2),
never a ``ValueError`` from deep inside the scanner. The ``[scan]`` keys are the settings of
:class:`~fleet_scan.options.ScanOptions` (checked by their types, then by the options' own rules) plus the three
the scan command itself reads (``devices``, ``actions``, ``policy_scope``); the ``[policy]`` keys are the fields of
:class:`~sdcguard.fleet.policy.QuarantinePolicy`, checked the same way. Also here: the ``--config`` and
``--action`` options the commands that read the file share.
"""

from __future__ import annotations

import math
import os
import tomllib
import typing
from collections.abc import Callable, Sequence
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, TypeVar

import click

from sdcguard.durations import parse_seconds
from sdcguard.errors import BadInput
from sdcguard.fleet.actions import ActionTemplate
from sdcguard.fleet.policy.settings import PolicyScope, QuarantinePolicy

from .options import ScanOptions, setting_kind, setting_value, settings

__all__ = [
    "SCAN_KEYS",
    "POLICY_SCOPES",
    "read_config",
    "load_config",
    "load_policy",
    "parse_actions",
    "config_option",
    "actions_option",
    "drill_store_option",
]

F = TypeVar("F", bound=Callable[..., Any])

POLICY_SCOPES: tuple[str, ...] = typing.get_args(PolicyScope)
"""Where the policy runs after a scan (``fleet`` or ``node``; :mod:`sdcguard.fleet.policy`)."""


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


_OF_KIND: dict[type, Callable[[Any], bool]] = {
    float: _number,
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    bool: lambda v: isinstance(v, bool),
    str: lambda v: isinstance(v, str) and bool(v),
}


def _setting_check(f: Field[Any]) -> Callable[[Any], bool]:
    """A ``[scan]`` value of a :class:`ScanOptions` setting: of the setting's type (a duration: a number of seconds
    or a text with a unit), and one the options accept."""
    of_kind = _OF_KIND[setting_kind(f)]
    duration = bool(f.metadata.get("duration"))

    def ok(v: Any) -> bool:
        if not (of_kind(v) or (duration and isinstance(v, str))):
            return False
        try:
            ScanOptions(db="", **{f.name: setting_value(f, v)})
        except BadInput:
            return False
        return True

    return ok


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


SCAN_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{key: (_setting_check(f), f.metadata["expects"]) for key, f in settings().items()},
    "actions": (_strings, 'a list of command-line strings, e.g. ["slurm-drain"]'),
    "devices": (_strings, 'a list of device specs, e.g. ["cuda:0", "cpu:3"]'),
    "policy_scope": (lambda v: v in POLICY_SCOPES, " or ".join(f'"{s}"' for s in POLICY_SCOPES)),
}
"""Every ``[scan]`` key: its check and what it expects, in words."""


def read_config(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``, every value checked (a ``[policy]`` duration given as text, ``window_s = "7d"``,
    comes back in seconds); :class:`BadInput` names the first wrong one."""
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
            ok, expected = _OF_KIND[int](value) and value >= -(2**63), "a whole number"
        elif key.endswith("_s") and isinstance(value, str):  # a duration: seconds, or a text with a unit
            try:
                section[key] = parse_seconds(value, option=key)
                ok, expected = True, ""
            except BadInput:
                ok, expected = False, "a duration: seconds, or a number and a unit (7d, 12h)"
        else:
            seconds = " of seconds, or a duration (7d)" if key.endswith("_s") else ""
            ok, expected = _number(value), "a number" + seconds
        if not ok:
            raise BadInput(f"config {path}: [policy] {key} = {value!r}: expected {expected}")
    try:
        QuarantinePolicy(**section)
    except (TypeError, ValueError) as e:
        raise BadInput(f"config {path}: [policy] {e}") from None


def load_config(path: Path | None) -> dict[str, Any]:
    """The TOML config (``{}`` without one), every value checked; ``BadInput`` names the file, the key and what is
    expected."""
    return {} if path is None else read_config(path)


def load_policy(config: dict[str, Any]) -> QuarantinePolicy:
    """The :class:`~sdcguard.fleet.policy.QuarantinePolicy` of the config's ``[policy]`` section."""
    section = dict(config.get("policy", {}))
    known = {f.name for f in fields(QuarantinePolicy)}
    unknown = set(section) - known
    if unknown:
        raise BadInput(f"[policy]: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    try:
        return QuarantinePolicy(**section)
    except (TypeError, ValueError) as e:
        raise BadInput(f"[policy]: {e}") from None


def parse_actions(given: Sequence[str], section: dict[str, Any]) -> list[ActionTemplate]:
    """The action templates: ``--action`` (repeatable), else ``$SDCGUARD_ACTIONS`` (one per line), else the
    config section's ``actions``."""
    texts = list(given)
    if not texts:
        env = os.environ.get("SDCGUARD_ACTIONS", "")
        texts = [line for line in env.splitlines() if line.strip()] or list(section.get("actions", []))
    return [ActionTemplate.from_text(t) for t in texts]


def config_option(f: F) -> F:
    """``--config FILE`` (``$SDCGUARD_CONFIG``): the TOML file with ``[scan]`` and ``[policy]`` sections."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="SDCGUARD_CONFIG",
        default=None,
        help="TOML file with [scan] and [policy] sections ($SDCGUARD_CONFIG).",
    )(f)


def drill_store_option(f: F) -> F:
    """``--drill-store FILE`` (``$SDCGUARD_DRILL_STORE``): where fire drills are recorded and read
    (:mod:`sdcguard.fleet.store.drills`)."""
    return click.option(
        "--drill-store",
        "drill_store",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="SDCGUARD_DRILL_STORE",
        default=None,
        help="The store of fire drills (--inject), never the fleet's record (default: beside --db, X.drills.db; "
        "`sdcguard report --drills` reads it).",
    )(f)


def actions_option(f: F) -> F:
    """``--action TEMPLATE`` (repeatable): what runs for each device the policy quarantines."""
    return click.option(
        "--action",
        "actions",
        multiple=True,
        metavar="TEMPLATE",
        help="Command run (as an argv list, no shell) for each quarantined device; placeholders {device} {host} "
        "{reason}; or slurm-drain / kubernetes-taint. Repeatable; $SDCGUARD_ACTIONS holds one per line.",
    )(f)
