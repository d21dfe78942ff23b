"""``sdcguard merge OUT.db IN.db...``: per-node stores into one fleet store (idempotent)."""

from __future__ import annotations

from pathlib import Path

import click

from ..entry import STORE
from ..fleet.merge import drills_left_out, merge_stores

__all__ = ["merge"]


@click.command("merge")
@click.argument("out", type=STORE)
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--full", is_flag=True, help="Read every row of every input again, not only what is new since its last merge."
)
def merge(out: str | Path, inputs: tuple[Path, ...], full: bool) -> None:
    """Merge per-node stores IN.db... into OUT (created if missing: a SQLite file, or a PostgreSQL server's
    postgresql:// URL); a directory means every *.db in it.

    Each input brings only what is new since its last merge into OUT.db; merging an input twice adds nothing.
    An input that went backwards (its newest scans pruned, restored from a backup) is noticed and read in full.
    Inputs are only read.

    The training guard's per-job spools (store=/shared/sdcguard/jobs/JOB.db) are merged the same way.

    Example: sdcguard merge fleet.db /shared/sdcguard/nodes /shared/sdcguard/jobs
    """
    stats = merge_stores(out, inputs, full=full)
    for p in drills_left_out(out, inputs):
        click.echo(f"{p}: a drill store, left out (fire drills never enter the fleet's record)", err=True)
    if not stats:
        click.echo(f"nothing to merge: no *.db store in {', '.join(map(str, inputs))}")
    for s in stats:
        click.echo(
            f"{s.source}: +{s.devices} devices, +{s.scans} scans, +{s.results} results, +{s.incidents} incidents, "
            f"+{s.quarantine_history} quarantine changes"
            + (f" ({s.skipped_scans} scans older than the retention horizon skipped)" if s.skipped_scans else "")
            + (
                f"; it went backwards since the last merge (the row at the watermark of {', '.join(s.rewound)} is "
                "gone or another: its newest rows pruned, or restored from an older backup), so those were read "
                "in full"
                if s.rewound
                else ""
            )
        )
