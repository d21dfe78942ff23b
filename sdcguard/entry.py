"""What every command-line entry shares: the exit codes, the one-line error rule and the store's default path.

The ``sdcguard`` command (:mod:`sdcguard.cli`) and the scanner's own entry, ``python -m fleet_scan``
(:mod:`fleet_scan.command`), both end by these rules (DESIGN.md): 0 every checked device passed, 1 corruption
found, 2 could not run; ``128 + N`` when signal ``N`` stopped the work. Errors are one line on stderr, never a
traceback (``SDCGUARD_DEBUG=1`` shows it).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from .errors import SdcguardError

__all__ = ["EXIT_OK", "EXIT_CORRUPTION", "EXIT_CANNOT_RUN", "exit_code_for_signal", "OneLineErrors", "DB_ENV",
           "DEFAULT_DB", "default_db"]

EXIT_OK = 0
"""Every checked device passed."""
EXIT_CORRUPTION = 1
"""Corruption was found."""
EXIT_CANNOT_RUN = 2
"""Could not run: bad input, no device, golden data or suite suspect."""
_EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT) ended the command: what a shell reports."""

DB_ENV = "SDCGUARD_DB"
"""The environment variable naming the fleet store."""
DEFAULT_DB = "sdcguard.db"
"""The fleet store without ``--db`` or ``$SDCGUARD_DB``: this file in the working directory."""


def default_db() -> str:
    """The fleet store without ``--db``: ``$SDCGUARD_DB`` (unless empty), else :data:`DEFAULT_DB`."""
    return os.environ.get(DB_ENV) or DEFAULT_DB


def exit_code_for_signal(signum: int) -> int:
    """The exit code of work stopped by a signal: 128 + its number (130 SIGINT, 143 SIGTERM), as a shell reports a
    process the signal killed, so cron, systemd and Slurm see unfinished work, never "all passed"."""
    return 128 + int(signum)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class OneLineErrors(click.Command):
    """A click command (or, first in the bases, a group) whose errors end as one line on stderr and an exit code.

    Library errors (:class:`~sdcguard.errors.SdcguardError`) and usage errors exit with
    :data:`EXIT_CANNOT_RUN`; a bug is one line naming it as an internal error; a command's own ``ctx.exit(code)``
    passes its code on."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        standalone = kwargs.pop("standalone_mode", True)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
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
        except (click.ClickException, SdcguardError) as e:
            message = e.format_message() if isinstance(e, click.ClickException) else str(e)
            click.echo(f"sdcguard: error: {_one_line(message)}", err=True)
            if standalone:
                sys.exit(EXIT_CANNOT_RUN)
            raise
        except (KeyboardInterrupt, BrokenPipeError):
            sys.exit(_EXIT_INTERRUPTED)
        except Exception as e:  # a bug: still one line, the traceback on request
            if os.environ.get("SDCGUARD_DEBUG"):
                raise
            click.echo(
                f"sdcguard: internal error: {type(e).__name__}: {_one_line(str(e))} (SDCGUARD_DEBUG=1 shows the traceback)",
                err=True,
            )
            if standalone:
                sys.exit(EXIT_CANNOT_RUN)
            raise
