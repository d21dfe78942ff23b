"""``sdcguard db init|grant``: set up a fleet store on a PostgreSQL server (as its owner)."""

from __future__ import annotations

import click

from ..errors import BadInput
from .common import open_store

__all__ = ["db"]


@click.group("db")
def db() -> None:
    """Set up a fleet store on a PostgreSQL server: create it, and grant roles what they need.

    Run these as the store's owner; credentials come from libpq (~/.pgpass, a service file, $PGPASSWORD), never
    from the --db URL.
    """


@db.command("init")
def init() -> None:
    """Create the store's tables in --db's database and schema (or migrate an older store); idempotent.

    Example: sdcguard --db 'postgresql://db.example/sdcguard?options=-csearch_path%3Dfleet' db init
    """
    with open_store(create=True) as store:
        if store.backend != "postgresql":
            raise BadInput(f"{store.path} is a SQLite file: `db init` sets up a store on a PostgreSQL server")
        click.echo(f"fleet store ready in {store.path} (store id {store.store_id})")


@db.command("grant")
@click.argument("role")
@click.option(
    "--reader", is_flag=True, help="Only what a report needs (SELECT); default: a scan node's or a job's writes."
)
@click.option("--print", "print_only", is_flag=True, help="Print the SQL statements instead of running them.")
def grant(role: str, reader: bool, print_only: bool) -> None:
    """Grant ROLE (made beforehand: CREATE ROLE ROLE LOGIN) a writer's or a reader's rights on the store.

    A writer (scan nodes, training jobs) may read every table and add and update rows, never delete scans,
    results, incidents or any history, never change the schema.

    Example: sdcguard --db postgresql://db.example/sdcguard db grant scanner
    """
    with open_store(create=False) as store:
        statements = store.grant(role, "reader" if reader else "writer", run=not print_only)
    for statement in statements:
        click.echo(statement + ";")
    if not print_only:
        click.echo(f"granted {role} a {'reader' if reader else 'writer'}'s rights on {store.path}", err=True)
