"""``sdcguard merge OUT.db IN.db...``: per-node stores into one fleet store (idempotent)."""

from __future__ import annotations

from pathlib import Path

import click

from ..fleet.merge import merge_stores

__all__ = ["merge"]


@click.command("merge")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def merge(out: Path, inputs: tuple[Path, ...]) -> None:
    """Merge per-node stores IN.db... into OUT.db (created if missing). Merging an input twice adds nothing.

    Example: sdcguard merge fleet.db /shared/sdcguard/*.db
    """
    for s in merge_stores(out, inputs):
        click.echo(
            f"{s.source}: +{s.devices} devices, +{s.scans} scans, +{s.results} results, +{s.incidents} incidents, "
            f"+{s.quarantine_history} quarantine changes"
        )
