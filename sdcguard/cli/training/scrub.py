"""``sdcguard scrub PATH...``: re-read checkpoints at rest and check every tensor against its recorded fingerprint.

A thin layer over :func:`sdcguard.checkpoint.scrub.scrub_one` (torch is imported only when it runs; without it, one
line says how to install it): one line per checkpoint, every verdict recorded in the store (``--db``), a progress
bar on a terminal, and the exit code of the worst verdict. A store that cannot take the record never hides a
verdict: a corrupt checkpoint still exits 1 (what cron alerts on), the store's problem one more line on stderr.
Without ``--db`` or ``$SDCGUARD_DB`` the verdicts go into ``./sdcguard.db`` only when that store exists; otherwise
a line says they were not recorded (no store is created where nobody asked for one).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ...entry import DEFAULT_DB
from ...errors import SdcguardError, needs_extra
from ...exit_codes import EXIT_CANNOT_RUN, EXIT_CORRUPTION, EXIT_OK
from ..common import format_option, open_store

if TYPE_CHECKING:
    from ...checkpoint.scrub import ScrubResult

__all__ = ["scrub"]


@click.command("scrub")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--record/--no-record", default=True, show_default=True, help="Record every verdict in the store (--db).")
@format_option("text", "json")
@click.pass_context
def scrub(ctx: click.Context, paths: tuple[Path, ...], record: bool, fmt: str) -> None:
    """Re-read checkpoints at rest; compare every saved tensor with the fingerprint recorded when it was saved.

    PATH is a checkpoint saved by sdcguard.checkpoint.save / async_save, or a directory of them. Reads are
    sequential, one tensor in memory at a time; the pages read are dropped from the page cache afterwards.

    Exit codes: 0 every checkpoint is clean (every saved tensor read and matched); 1 a tensor (named), DCP's index
    or the fingerprint record differs from what was saved, or a data file is truncated; 2 a checkpoint could not
    be checked, in whole (missing, no fingerprint record, unreadable) or in part (unverified: saved tensors
    without a recorded fingerprint, or saved with transforms, are named).

    Example: sdcguard --db fleet.db scrub /ckpt/run42
    """
    if importlib.util.find_spec("torch") is None:  # the scan-node install: DCP's index is torch's pickle
        raise needs_extra("sdcguard scrub", "torch", "torch")
    from ...checkpoint.scrub import expand, scrub_one

    targets = expand(paths)
    with _progress(targets) as advance:
        results = []
        for target in targets:
            result = scrub_one(target, progress=advance)
            results.append(result)
            if fmt == "text":  # a checkpoint that is not clean is a finding: on stderr, as every error
                click.echo(_line(result), err=result.status != "clean")
    recorded = _record(ctx, results) if record else True
    if fmt == "json":
        click.echo(json.dumps([asdict(r) for r in results], indent=1))
    statuses = {r.status for r in results}
    if "corrupt" in statuses:
        ctx.exit(EXIT_CORRUPTION)
    cannot = statuses & {"unreadable", "unverified"}
    ctx.exit(EXIT_CANNOT_RUN if cannot or not recorded else EXIT_OK)


def _record(ctx: click.Context, results: list[ScrubResult]) -> bool:
    """Record the verdicts in the store; say on stderr why not when they cannot be (False: a store was named, or
    found, and refused them)."""
    root = ctx.find_root()
    named = root.get_parameter_source("db") not in (click.core.ParameterSource.DEFAULT, None)
    db = root.obj.db
    if not named and not Path(db).exists():
        click.echo(
            f"sdcguard: the verdicts were not recorded: no store named (--db or $SDCGUARD_DB) and no ./{DEFAULT_DB} "
            "here (--no-record says not to record them)",
            err=True,
        )
        return True
    try:
        with open_store(create=True) as store:
            for r in results:
                store.training.record_scrub(
                    checkpoint_id=r.checkpoint_id,
                    status=r.status,
                    tensors=r.tensors,
                    bytes=r.bytes,
                    bad=r.bad,
                    unverified=r.unverified,
                    detail=r.detail,
                )
    except SdcguardError as e:
        click.echo(f"sdcguard: error: the verdicts above were not recorded: {' '.join(str(e).split())}", err=True)
        return False
    return True


def _line(r: ScrubResult) -> str:
    rate = f", {r.bytes / r.seconds / 1e9:.2f} GB/s" if r.seconds > 0 and r.bytes else ""
    unverified = f", {len(r.unverified)} unverified" if r.unverified else ""
    head = f"{r.status:10} {r.checkpoint_id} ({r.tensors} tensors{unverified}, {r.bytes / 1e6:.1f} MB{rate})"
    return head + (f": {r.detail}" if r.detail else "")


class _progress:
    """A byte-counting progress bar on stderr when it is a terminal; a no-op otherwise."""

    def __init__(self, targets: list[Path]) -> None:
        self.targets = targets
        self.bar: Any = None

    def __enter__(self) -> Callable[[int], None] | None:
        if not sys.stderr.isatty():
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        total = sum(f.stat().st_size for t in self.targets if t.is_dir() for f in t.glob("*.distcp"))
        self.bar = Progress(
            "scrub", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=Console(stderr=True), transient=True
        )
        self.bar.start()
        task = self.bar.add_task("scrub", total=total or None)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
