"""Helpers shared by the commands: opening the store, device ids, output formats, rich tables. (The config file and
the ``--config`` / ``--action`` options are the scanner's: :mod:`fleet_scan.config`.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from ..fleet.store.store import Store

__all__ = [
    "DEFAULT_SLOW_MAX_AGE",
    "open_store",
    "format_option",
    "confidence_option",
    "slow_max_age_option",
    "slow_max_age_s",
    "print_table",
    "fmt_float",
    "status_text",
    "device_id",
]

F = TypeVar("F", bound=Callable[..., Any])


def open_store(create: bool = False, *, readonly: bool = False, db: str | None = None) -> Store:
    """Open the store named by ``--db`` / ``$SDCGUARD_DB``, or ``db`` (errors become one line, exit 2, via the
    group).

    ``readonly``: the command only reads, so a store this user may not write is opened read-only; a writing
    command on such a store is refused with one line naming it read-only."""
    state = click.get_current_context().find_root().obj
    return Store.open(db if db is not None else state.db, create=create, readonly=readonly)


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


DEFAULT_SLOW_MAX_AGE = "1h"
"""How old kept slowness verdicts a report uses by default (the fleet policy and ``db refresh`` keep them)."""


def confidence_option(help_text: str) -> Callable[[F], F]:
    """``--confidence`` of the one-sided Clopper-Pearson bounds (0.5 to 0.9999, default 0.95)."""
    bounds = click.FloatRange(0.5, 0.9999)
    return click.option("--confidence", type=bounds, default=0.95, show_default=True, help=help_text)


def slow_max_age_option(f: F) -> F:
    """``--slow-max-age``: read the slowness verdicts kept in the store up to this old (0: compute them)."""
    return click.option(
        "--slow-max-age",
        default=DEFAULT_SLOW_MAX_AGE,
        show_default=True,
        help="Use the slowness verdicts kept in the store (by the fleet policy, `sdcguard db refresh`) when computed "
        "at most this long ago over a window of the same length; 0: always compute them (at 100,000 devices that "
        "reads 3 million rows).",
    )(f)


def slow_max_age_s(text: str) -> float:
    """``--slow-max-age`` in seconds: a duration, or 0 (always compute the verdicts); one line and exit 2 else."""
    from ..durations import parse_duration

    return 0.0 if text.strip() in ("0", "0s") else parse_duration(text, option="--slow-max-age")


def fmt_float(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


_STATUS_STYLE = {"healthy": "green", "suspect": "yellow", "quarantined": "bold red", "probation": "magenta"}


def status_text(status: str) -> str:
    style = _STATUS_STYLE.get(status)
    return f"[{style}]{status}[/{style}]" if style else status


def print_table(
    title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], caption: str | None = None
) -> None:
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
