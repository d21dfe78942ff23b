"""The ``sdcguard`` command line: a thin click layer over the library.

Each command lives in its own module and is imported only when it runs, so ``sdcguard report`` never pays for
(or needs) torch or cupy. Library errors (:class:`sdcguard.errors.SdcguardError`) and usage errors become one line
on stderr and exit code 2; exit code 1 is reserved for "corruption found".
"""

from __future__ import annotations

import gc
import importlib
from dataclasses import dataclass
from pathlib import Path

import click

from ..entry import DB_ENV, DEFAULT_DB, STORE, OneLineErrors

__all__ = ["cli", "main", "CliState"]

# command name -> "module:attribute"; a module is imported only when its command runs or help lists it.
_COMMANDS: dict[str, str] = {
    "report": "sdcguard.cli.report:report",
    "quarantine": "sdcguard.cli.quarantine:quarantine",
    "incidents": "sdcguard.cli.training.incidents:incidents",
    "checkpoints": "sdcguard.cli.training.checkpoints:checkpoints",
    "scrub": "sdcguard.cli.training.scrub:scrub",
    "merge": "sdcguard.cli.merge:merge",
    "policy": "sdcguard.cli.policy:policy",
    "prune": "sdcguard.cli.prune:prune",
    "export": "sdcguard.cli.export:export",
    "scan": "fleet_scan.command:scan",
    "golden": "sdcguard.cli.golden:golden",
    "forward": "sdcguard.cli.forward:forward",
    "db": "sdcguard.cli.db:db",
    "launch": "sdcguard.cli.training.launch:launch",
    "plan": "sdcguard.cli.plan:plan",
    "import": "sdcguard.cli.imports:import_group",
}


@dataclass
class CliState:
    """What the top-level options hand to every command (``ctx.obj``)."""

    db: str | Path
    """A SQLite file, or a PostgreSQL server's ``postgresql://`` URL."""


class _Process:
    own = False
    """Whether the command runs in a process of its own (:func:`main`), not in a caller's."""


_process = _Process()


class _LazyGroup(OneLineErrors, click.Group):
    """The commands, each imported when it runs; errors end as one line (:class:`~sdcguard.entry.OneLineErrors`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        if _process.own:
            # What the imports made lives as long as the process: out of the collector's sight, a full collection
            # walks only what the command builds (the kept verdicts of 100,000 devices read back 25% faster). Only
            # in a process of its own (main()): in a caller's process (click's test runner) it would keep that
            # process's cycles from ever being collected.
            gc.freeze()
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    type=STORE,
    envvar=DB_ENV,
    default=DEFAULT_DB,
    show_default=True,
    help="Fleet store: a SQLite file, or a PostgreSQL server's postgresql://HOST/DB URL (credentials from libpq: "
    "~/.pgpass, a service file, $PGPASSWORD; never in the URL). Default: $SDCGUARD_DB, else ./sdcguard.db.",
)
@click.version_option(package_name="sdcguard")
@click.pass_context
def cli(ctx: click.Context, db: str | Path) -> None:
    """sdcguard: find GPUs and CPU cores that corrupt data silently.

    Exit codes: 0 every checked device passed; 1 corruption found; 2 could not run.
    """
    ctx.obj = CliState(db=db)


def main() -> None:
    """Console-script entry point."""
    _process.own = True
    cli.main(prog_name="sdcguard")
