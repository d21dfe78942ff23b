"""``sdcguard export prometheus FILE``: a node-exporter textfile, written atomically."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import BadInput
from .common import DEFAULT_SLOW_MAX_AGE, open_store, slow_max_age_option, slow_max_age_s

__all__ = ["export"]


@click.group("export")
def export() -> None:
    """Export the fleet store to monitoring systems."""


@export.command("prometheus")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@slow_max_age_option
def prometheus(file: Path, slow_max_age: str = DEFAULT_SLOW_MAX_AGE) -> None:
    """Write FILE for node-exporter's textfile collector (DCGM-style labels gpu, UUID, Hostname).

    Example: sdcguard export prometheus /var/lib/node_exporter/textfile/sdcguard.prom
    """
    from ..fleet.report.prometheus import write_textfile

    max_age = slow_max_age_s(slow_max_age)
    with open_store(readonly=True) as store:
        n = write_textfile(store, file, slow_max_age_s=max_age)
    click.echo(f"{file}: {n} devices")


@export.command("spool")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--spool",
    "spools",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A spool (default: this host's, in ~/.local/state/sdcguard, or $SDCGUARD_SPOOL).",
)
def spool(file: Path, spools: tuple[Path, ...]) -> None:
    """Write FILE for node-exporter on a scan node or a training host: what its spools hold that has not reached
    their server, and since when (deploy/prometheus alerts when a spool waits an hour).

    Example: sdcguard export spool /var/lib/node_exporter/textfile/sdcguard-spool.prom
    """
    from ..devices import hostname
    from ..fleet.report.files import write_atomic
    from ..fleet.report.prometheus import render_spools
    from ..fleet.store.spool import spools_here

    chosen = list(spools) or spools_here()
    for p in chosen:
        if not p.is_file():
            raise BadInput(f"--spool {p}: no such spool")
    write_atomic(file, render_spools(chosen, host=hostname()))
    click.echo(f"{file}: {len(chosen)} spool(s)")
