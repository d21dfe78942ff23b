"""``sdcguard checkpoints``: the checkpoints the training guard saved, and whether each was verified."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ...durations import iso_utc, since_timestamp
from ..common import format_option, open_store, print_table

__all__ = ["checkpoints"]


@click.command("checkpoints")
@click.option("--since", default="all", show_default=True, help="Window: a duration (12h, 7d, 2w) or 'all'.")
@click.option(
    "--job",
    default=None,
    help="Only this job's checkpoints (its id as the guard recorded it: the launcher's, or one it made).",
)
@format_option("table", "json")
def checkpoints(since: str, job: str | None, fmt: str) -> None:
    """Checkpoints saved with the training guard: id, step, verified or not (or failed), digest, job.

    A verified checkpoint holds a state every rank's checks vouched for; an incident's ``rollback`` names the
    newest one older than the earliest step the fault could have touched. ``failed``: an asynchronous save whose
    background write failed (never verified). ``sdcguard scrub`` re-reads checkpoints at rest.

    Example: sdcguard checkpoints --job 4242 --format json
    """
    start = since_timestamp(since, default="all")
    with open_store(readonly=True) as store:
        found = store.training.checkpoints(since=start, job=job)
    if fmt == "json":
        click.echo(json.dumps([{**asdict(c), "time": iso_utc(c.time)} for c in found], indent=1))
        return
    print_table(
        "checkpoints",
        ["time (UTC)", "checkpoint", "step", "verified", "digest", "job"],
        [
            [
                iso_utc(c.time) or "",
                c.checkpoint_id,
                str(c.step),
                f"failed: {c.detail}" if c.status == "failed" else "yes" if c.verified else "no",
                c.digest[:16] or "-",
                c.job or "-",
            ]
            for c in found
        ],
        caption=None if found else "no checkpoint recorded",
    )
