"""The ``sdcguard`` command line: a thin click layer over the library.

Each command lives in its own module and is imported only when it runs, so ``sdcguard report`` never pays for
(or needs) torch or cupy. Library errors (:class:`sdcguard.errors.SdcguardError`) and usage errors become one line
on stderr and exit code 2; exit code 1 is reserved for "corruption found".
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..errors import SdcguardError

__all__ = ["cli", "main", "CliState", "EXIT_OK", "EXIT_CORRUPTION", "EXIT_CANNOT_RUN"]

EXIT_OK = 0
"""Every checked device passed."""
EXIT_CORRUPTION = 1
"""Corruption was found."""
EXIT_CANNOT_RUN = 2
"""Could not run: bad input, no device, golden data or suite suspect."""

# command name -> "module:attribute"; a module is imported only when its command runs or help lists it.
_COMMANDS: dict[str, str] = {
    "report": "sdcguard.cli.report:report",
    "quarantine": "sdcguard.cli.quarantine:quarantine",
    "incidents": "sdcguard.cli.incidents:incidents",
    "checkpoints": "sdcguard.cli.checkpoints:checkpoints",
    "scrub": "sdcguard.cli.scrub:scrub",
    "merge": "sdcguard.cli.merge:merge",
    "policy": "sdcguard.cli.policy:policy",
    "prune": "sdcguard.cli.prune:prune",
    "export": "sdcguard.cli.export:export",
    "scan": "sdcguard.cli.scan:scan",
    "golden": "sdcguard.cli.golden:golden",
}


@dataclass
class CliState:
    """What the top-level options hand to every command (``ctx.obj``)."""

    db: Path


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SdcguardError as e:
            raise _Fail(str(e)) from e

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        # Every error is one line on stderr: no usage block, no traceback (SDCGUARD_DEBUG=1 shows them).
        standalone = standalone_mode
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            # Without standalone mode click *returns* the code of a command's ctx.exit(code) instead of raising:
            # pass it on, or `ctx.exit(1)` (corruption found) would end the process with 0.
            if standalone and isinstance(rv, int) and not isinstance(rv, bool) and rv:
                sys.exit(rv)
            return rv
        except click.exceptions.Exit as e:
            if standalone:
                sys.exit(e.exit_code)
            raise
        except click.exceptions.Abort:
            click.echo("sdcguard: aborted", err=True)
            if standalone:
                sys.exit(EXIT_CANNOT_RUN)
            raise
        except click.ClickException as e:
            click.echo(f"sdcguard: error: {_one_line(e.format_message())}", err=True)
            code = e.exit_code if isinstance(e, _Fail) else EXIT_CANNOT_RUN
            if standalone:
                sys.exit(code)
            raise
        except (KeyboardInterrupt, BrokenPipeError):
            sys.exit(130)
        except Exception as e:  # a bug: still one line, the traceback on request
            if os.environ.get("SDCGUARD_DEBUG"):
                raise
            click.echo(
                f"sdcguard: internal error: {type(e).__name__}: {_one_line(str(e))} "
                "(SDCGUARD_DEBUG=1 shows the traceback)",
                err=True,
            )
            if standalone:
                sys.exit(EXIT_CANNOT_RUN)
            raise


class _Fail(click.ClickException):
    """A library error surfaced by a command: exit code 2."""

    exit_code = EXIT_CANNOT_RUN


def _one_line(text: str) -> str:
    return " ".join(text.split())


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="SDCGUARD_DB",
    default="sdcguard.db",
    show_default=True,
    help="Fleet store (SQLite). Default: $SDCGUARD_DB, else ./sdcguard.db.",
)
@click.version_option(package_name="sdcguard")
@click.pass_context
def cli(ctx: click.Context, db: Path) -> None:
    """sdcguard: find GPUs and CPU cores that corrupt data silently.

    Exit codes: 0 every checked device passed; 1 corruption found; 2 could not run.
    """
    ctx.obj = CliState(db=db)


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="sdcguard")
