"""What every command line shares: the one-line error rule and the store's default path.

The ``sdcguard`` command (:mod:`sdcguard.cli`) and the scanner's own entry, ``python -m fleet_scan``
(:mod:`fleet_scan.command`), both end by these rules (DESIGN.md): errors are one line on stderr, never a traceback
(``SDCGUARD_DEBUG=1`` shows it), and the exit code is one of :mod:`sdcguard.exit_codes`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from .errors import SdcguardError
from .exit_codes import EXIT_CANNOT_RUN, exit_code_for_signal

__all__ = [
    "OneLineErrors",
    "DB_ENV",
    "DEFAULT_DB",
    "default_db",
    "SERVER_SCHEMES",
    "is_server_url",
    "STORE",
    "SECONDS",
    "SECONDS_OR_ZERO",
]

DB_ENV = "SDCGUARD_DB"
"""The environment variable naming the fleet store."""
DEFAULT_DB = "sdcguard.db"
"""The fleet store without ``--db`` or ``$SDCGUARD_DB``: this file in the working directory."""


SERVER_SCHEMES = ("postgresql://", "postgres://")
"""How a ``--db`` that names a PostgreSQL server begins (libpq's URI schemes); anything else is a SQLite file."""


def is_server_url(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a PostgreSQL server (``postgresql://...``) rather than a SQLite file."""
    return str(db).startswith(SERVER_SCHEMES)


class _StoreParam(click.ParamType[str | Path]):
    """A fleet store on the command line: a SQLite file (a ``Path``) or a ``postgresql://`` URL (kept a ``str``:
    a path would fold its ``//``)."""

    name = "PATH|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | Path:
        if isinstance(value, Path):
            return value
        text = str(value)
        if is_server_url(text):
            return text
        if not text:
            self.fail("an empty name is no fleet store", param, ctx)
        if Path(text).is_dir():
            self.fail(f"{text} is a directory, not a fleet store file", param, ctx)
        return Path(text)


class _SecondsParam(click.ParamType[float]):
    """A duration on the command line: seconds (``60``) or a number and a unit (``90s``, ``30m``, ``2h``); as
    seconds (:func:`~sdcguard.durations.parse_seconds`). ``zero``: 0 is allowed."""

    name = "DURATION"

    def __init__(self, *, zero: bool = False) -> None:
        self.zero = zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from .durations import parse_seconds

        option = param.opts[0] if param is not None and param.opts else "duration"
        try:
            return parse_seconds(value, option=option, zero=self.zero)
        except SdcguardError as e:
            self.fail(str(e), param, ctx)


SECONDS = _SecondsParam()
"""The click type of a positive duration (``--budget``)."""
SECONDS_OR_ZERO = _SecondsParam(zero=True)
"""The click type of a duration that may be 0 (``--idle-window``)."""

STORE = _StoreParam()
"""The click type of every ``--db`` (and of ``merge``'s OUT)."""


def default_db() -> str:
    """The fleet store without ``--db``: ``$SDCGUARD_DB`` (unless empty), else :data:`DEFAULT_DB`."""
    return os.environ.get(DB_ENV) or DEFAULT_DB


def _one_line(text: str) -> str:
    return " ".join(text.split())


class OneLineErrors(click.Command):
    """A click command (or, first in the bases, a group) whose errors end as one line on stderr and an exit code.

    Library errors (:class:`~sdcguard.errors.SdcguardError`) and usage errors exit with
    :data:`EXIT_CANNOT_RUN`; a bug is one line naming it as an internal error; a command's own ``ctx.exit(code)``
    passes its code on."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
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
        except click.exceptions.Abort as e:
            # click turns a Ctrl-C (KeyboardInterrupt) into Abort: work stopped by a signal exits 128 + SIGINT,
            # as a shell reports it; an Abort of click's own (an answer refused at a prompt) could not run.
            interrupted = isinstance(e.__cause__ or e.__context__, KeyboardInterrupt)
            click.echo("sdcguard: interrupted" if interrupted else "sdcguard: aborted", err=True)
            if standalone:
                sys.exit(exit_code_for_signal(signal.SIGINT) if interrupted else EXIT_CANNOT_RUN)
            raise
        except KeyboardInterrupt:
            click.echo("sdcguard: interrupted", err=True)
            if standalone:
                sys.exit(exit_code_for_signal(signal.SIGINT))
            raise
        except (click.ClickException, SdcguardError) as e:
            message = e.format_message() if isinstance(e, click.ClickException) else str(e)
            if isinstance(e, click.NoSuchOption) and e.option_name == "--db" and e.ctx is not None:
                command = " ".join(e.ctx.command_path.split()[1:])
                message += f" --db belongs to sdcguard itself: put it before the command (sdcguard --db FILE {command})"
            click.echo(f"sdcguard: error: {_one_line(message)}", err=True)
            if standalone:
                sys.exit(EXIT_CANNOT_RUN)
            raise
        except BrokenPipeError:  # the reader of our output went away (`| head`): as if stopped
            sys.exit(exit_code_for_signal(signal.SIGINT))
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
