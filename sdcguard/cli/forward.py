"""``sdcguard forward``: send a node's or a job's spool to the fleet store's server."""

from __future__ import annotations

from pathlib import Path

import click

from ..entry import is_server_url
from ..errors import BadInput
from ..fleet.store.spool import SPOOL_ENV, default_spool, legacy_spool, spool_owner
from ..fleet.store.spool import forward as send

__all__ = ["forward"]


@click.command("forward")
@click.option(
    "--spool",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=SPOOL_ENV,
    default=None,
    help="The spool (default: $SDCGUARD_SPOOL, else ~/.local/state/sdcguard/spool-HOST-SERVER.db, SERVER naming "
    "the --db URL; the spool of an older version, spool-HOST.db, is sent too when it was written for this server).",
)
def forward(spool: Path | None) -> None:
    """Send what the server lacks of the spool (what scans and jobs wrote while it could not be reached) to the
    --db server: a merge by its watermarks, so forwarding twice sends nothing twice. Exit 2 while the server
    cannot be reached (the spool stays as it is).

    Example: sdcguard --db postgresql://db.example/sdcguard forward
    """
    db = click.get_current_context().find_root().obj.db
    if not is_server_url(db):
        raise BadInput(f"--db {db} is a SQLite file: forward sends a spool to a postgresql:// server")
    paths = [spool] if spool is not None else [default_spool(str(db))]
    if spool is None and spool_owner(legacy_spool()) == str(db):
        paths.insert(0, legacy_spool())  # a spool from before its path named the server
    for path in paths:
        stats = send(str(db), path)
        if stats is None:
            click.echo(f"nothing to forward: no spool at {path}")
            continue
        click.echo(
            f"{path}: +{stats.scans} scans, +{stats.results} results, +{stats.incidents} incidents, "
            f"+{stats.quarantine_history} quarantine changes sent to {db}"
        )
