"""``sdcguard export prometheus FILE``: a node-exporter textfile, written atomically."""

from __future__ import annotations

from pathlib import Path

import click

from .common import open_store

__all__ = ["export"]


@click.group("export")
def export() -> None:
    """Export the fleet store to monitoring systems."""


@export.command("prometheus")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def prometheus(file: Path) -> None:
    """Write FILE for node-exporter's textfile collector (DCGM-style labels gpu, UUID, Hostname).

    Example: sdcguard export prometheus /var/lib/node_exporter/textfile/sdcguard.prom
    """
    from ..fleet.report.prometheus import write_textfile

    with open_store(readonly=True) as store:
        n = write_textfile(store, file)
    click.echo(f"{file}: {n} devices")
