"""``sdcguard export prometheus FILE``: a node-exporter textfile, written atomically."""

from __future__ import annotations

from pathlib import Path

import click

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
