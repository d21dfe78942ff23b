"""``sdcguard db init|grant|refresh|move-drills``: set up a fleet store on a PostgreSQL server (as its owner), keep
the figures a report at fleet scale reads instead of computing them, and move an older store's fire drills out of
the fleet's record."""

from __future__ import annotations

import time
from pathlib import Path

import click

from fleet_scan.config import config_option, drill_store_option, load_config, load_policy

from ..durations import DEFAULT_WINDOW, since_timestamp
from ..errors import BadInput
from .common import confidence_option, open_store

__all__ = ["db"]


@click.group("db")
def db() -> None:
    """Set up a fleet store on a PostgreSQL server: create it, grant roles what they need; keep what reports read.

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
        click.echo(f"fleet store ready in {store.path} (store id {store.maintenance.store_id})")


@db.command("refresh")
@click.option(
    "--window",
    "windows",
    multiple=True,
    default=(DEFAULT_WINDOW, "30d"),
    show_default=True,
    help="A report window (duration, or 'all') to keep verdicts for; repeat for several.",
)
@confidence_option("The confidence of the kept reports' bounds (a report at another --confidence computes its rows).")
@config_option
def refresh(windows: tuple[str, ...], confidence: float = 0.95, config_path: Path | None = None) -> None:
    """Compute the slowness verdicts of every device over each window, then the report of the window, and keep
    both in the store, so that `sdcguard report --since W` reads them (for up to its --slow-max-age) and computes
    only the rows of the devices that changed since (a scan, a failure, an incident; their oldest evidence left the
    window) instead of every device's. Uses the [policy] slow_threshold and confidence, as the report and the
    policy do; a fleet policy run keeps its own window's verdicts too. Run it as a writer, e.g. from a CronJob
    every 15 minutes: a report then computes the rows of about the devices that scanned in the last 15 minutes.

    Example: sdcguard --db postgresql://db.example/sdcguard db refresh --window 7d --window 30d
    """
    from ..fleet.report.kept import keep_report
    from ..fleet.slow import SlowSettings
    from ..fleet.slow_fleet import fleet_slowness

    policy = load_policy(load_config(config_path))
    settings = SlowSettings(threshold=policy.slow_threshold, confidence=policy.confidence)
    now = time.time()
    starts = [(w, since_timestamp(w, now=now)) for w in windows]  # every window checked before the store is opened
    with open_store(create=False) as store:
        for window, since in starts:
            t = time.perf_counter()
            verdicts = fleet_slowness(store, since=since, settings=settings, now=now, keep=True)
            slow = sum(v.slow for v in verdicts.values())
            click.echo(
                f"kept the slowness verdicts of {len(verdicts):,} devices over {window} ({slow:,} slow) in "
                f"{time.perf_counter() - t:.1f} s"
            )
            t = time.perf_counter()
            n = keep_report(
                store, since=since, now=now, confidence=confidence, slow=settings, breaker=policy, slow_max_age_s=1.0
            )
            click.echo(f"kept the report of {n:,} devices over {window} in {time.perf_counter() - t:.1f} s")


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
        statements = store.maintenance.grant(role, "reader" if reader else "writer", run=not print_only)
    for statement in statements:
        click.echo(statement + ";")
    if not print_only:
        click.echo(f"granted {role} a {'reader' if reader else 'writer'}'s rights on {store.path}", err=True)


@db.command("move-drills")
@drill_store_option
def move_drills(drill_store: Path | None) -> None:
    """Move the fire drills (scans with --inject) that a store written before drills were kept apart still holds
    into its drill store, their tallies with them: from then on they count toward no rate, bound, slowness or
    counter of the fleet, and `sdcguard report --drills` shows them. Safe to rerun (a crash in between leaves the
    drills in both stores; the next run finishes the move). A quarantine a drill caused stays until `sdcguard
    quarantine release`. Run it on every store that may hold drills (node stores before a `merge --full`).

    Example: sdcguard --db fleet.db db move-drills
    """
    from ..fleet.store.drills import drill_store_for, move_legacy_drills

    with open_store(create=False) as store:
        moved = move_legacy_drills(store, drill_store_for(click.get_current_context().find_root().obj.db, drill_store))
    if not moved.scans:
        click.echo(f"no drill scans in {store.path}")
        return
    click.echo(
        f"moved {moved.scans:,} drill scan(s) ({moved.results:,} results) of {len(moved.devices):,} device(s) from "
        f"{store.path} to the drill store {moved.to}"
    )
