"""Helpers shared by the commands: opening the store, the config file and action templates, output formats,
rich tables."""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from ..errors import BadInput
from ..fleet.store import Store

__all__ = [
    "open_store", "format_option", "print_table", "fmt_float", "status_text", "device_id", "parse_action",
    "parse_actions", "load_config", "load_policy", "config_option", "actions_option",
]

F = TypeVar("F", bound=Callable[..., Any])


def open_store(create: bool = False, *, readonly: bool = False) -> Store:
    """Open the store named by ``--db`` / ``$SDCGUARD_DB`` (errors become one line, exit 2, via the group).

    ``readonly``: the command only reads, so a store this user may not write is opened read-only; a writing
    command on such a store is refused with one line naming it read-only."""
    state = click.get_current_context().find_root().obj
    return Store.open(state.db, create=create, readonly=readonly)


def device_id(text: str) -> str:
    """A device id as the store spells it: GPU UUIDs in lower case (``GPU-ABC...`` from nvidia-smi works too)."""
    from ..devices import gpu_id

    t = text.strip()
    if t.upper().startswith("GPU-"):
        try:
            return gpu_id("GPU-" + t[4:])
        except Exception:
            return t  # not a UUID: let the store say what is wrong with it
    return t


def format_option(*choices: str) -> Callable[[F], F]:
    """``--format`` with the given choices, the first is the default."""
    return click.option(
        "--format", "fmt", type=click.Choice(choices), default=choices[0], show_default=True, help="Output format."
    )


def fmt_float(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


_STATUS_STYLE = {"healthy": "green", "suspect": "yellow", "quarantined": "bold red", "probation": "magenta"}


def status_text(status: str) -> str:
    style = _STATUS_STYLE.get(status)
    return f"[{style}]{status}[/{style}]" if style else status


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]],
                caption: str | None = None) -> None:
    """A rich table on stdout (plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*r)
    console = Console(soft_wrap=False)
    if not console.is_terminal:
        console = Console(soft_wrap=False, width=200)  # piped output: do not fold ids into 80 columns
    console.print(table)


def parse_action(text: str) -> Any:
    """An :class:`~sdcguard.fleet.actions.ActionTemplate` from a command line (split with shlex, never run by a
    shell).

    ``slurm-drain`` and ``kubernetes-taint`` name the built-in templates. The name of any other template is its
    program plus a hash of the whole text: stable across runs, so the store knows whether it already ran.
    """
    from ..fleet.actions import ActionTemplate

    text = text.strip()
    if text == "slurm-drain":
        return ActionTemplate.slurm_drain()
    if text == "kubernetes-taint":
        return ActionTemplate.kubernetes_taint()
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise BadInput(f"bad --action {text!r}: {e}") from None
    if not argv:
        raise BadInput("empty --action: give a command line, e.g. 'scontrol update NodeName={host} State=DRAIN'")
    name = f"{Path(argv[0]).name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return ActionTemplate(name=name, argv=argv)


def parse_actions(given: Sequence[str], section: dict[str, Any]) -> list[Any]:
    """The action templates: ``--action`` (repeatable), else ``$SDCGUARD_ACTIONS`` (one per line), else the
    config section's ``actions``."""
    texts = list(given)
    if not texts:
        env = os.environ.get("SDCGUARD_ACTIONS", "")
        texts = [line for line in env.splitlines() if line.strip()] or list(section.get("actions", []))
    return [parse_action(t) for t in texts]


def load_config(path: Path | None) -> dict[str, Any]:
    """The TOML config (``{}`` without one), every value checked (:mod:`sdcguard.cli.config`); ``BadInput``
    names the file, the key and what is expected."""
    if path is None:
        return {}
    from .config import read_config

    return read_config(path)


def load_policy(config: dict[str, Any]) -> Any:
    """The :class:`~sdcguard.fleet.policy.QuarantinePolicy` of the config's ``[policy]`` section."""
    from dataclasses import fields

    from ..fleet.policy import QuarantinePolicy

    section = dict(config.get("policy", {}))
    known = {f.name for f in fields(QuarantinePolicy)}
    unknown = set(section) - known
    if unknown:
        raise BadInput(f"[policy]: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    try:
        return QuarantinePolicy(**section)
    except (TypeError, ValueError) as e:
        raise BadInput(f"[policy]: {e}") from None


def config_option(f: F) -> F:
    """``--config FILE`` (``$SDCGUARD_CONFIG``): the TOML file with ``[scan]`` and ``[policy]`` sections."""
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), envvar="SDCGUARD_CONFIG",
        default=None, help="TOML file with [scan] and [policy] sections ($SDCGUARD_CONFIG).",
    )(f)


def actions_option(f: F) -> F:
    """``--action TEMPLATE`` (repeatable): what runs for each device the policy quarantines."""
    return click.option(
        "--action", "actions", multiple=True, metavar="TEMPLATE",
        help="Command run (as an argv list, no shell) for each quarantined device; placeholders {device} {host} "
             "{reason}; or slurm-drain / kubernetes-taint. Repeatable; $SDCGUARD_ACTIONS holds one per line.",
    )(f)
