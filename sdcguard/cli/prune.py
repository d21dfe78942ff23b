"""``sdcguard prune --before 30d``: roll old scans into daily counts, so the store stays the size of its window."""

from __future__ import annotations

import time

import click

from ..durations import DAY_S, DEFAULT_WINDOW, DEFAULT_WINDOW_S, iso_utc, parse_duration
from ..errors import BadInput
from .common import open_store

__all__ = ["prune"]


@click.command("prune")
@click.option(
    "--before",
    "before",
    required=True,
    metavar="DURATION",
    help=f"Roll up scans older than this (e.g. 30d, 26w); at least {DEFAULT_WINDOW}, the policy's window.",
)
@click.option("--vacuum", is_flag=True, help="Then rewrite the file to return the freed space to the disk.")
def prune(before: str, vacuum: bool) -> None:
    """Roll every scan older than DURATION into per-device, per-family daily counts and delete its rows.

    Rates, test-hours, failure counts and scan counts stay exact; what goes is each old failure's detail (bits,
    element, location) and the time resolution below a day beyond the horizon. Run it on the fleet store, after
    the merge (a node store is small; pruned node scans are not merged again).

    Example: sdcguard --db fleet.db prune --before 30d --vacuum
    """
    seconds = parse_duration(before, option="--before")
    if seconds < DEFAULT_WINDOW_S:
        days = f"{DEFAULT_WINDOW_S / DAY_S:g} days"
        raise BadInput(
            f"--before {before} is shorter than {days}: the policy's window needs every row of the last {days}"
        )
    with open_store() as store:
        stats = store.maintenance.prune(before=time.time() - seconds)
        if vacuum:
            store.maintenance.vacuum()

    click.echo(
        f"rolled up {stats.scans} scans ({stats.results} rows) started before {iso_utc(stats.before)} into "
        f"{stats.rollup_rows} daily counts" + ("; file vacuumed" if vacuum else "")
    )
