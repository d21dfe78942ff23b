"""The exit codes of every command (DESIGN.md): 0 every checked device passed, 1 corruption found, 2 could not run;
``128 + N`` when signal ``N`` stopped the work. Plain numbers, no dependency: the scanner's worker and retest
processes exit by them too. How a command line ends (one line on stderr, then the code) is :mod:`sdcguard.entry`.
"""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_CORRUPTION", "EXIT_CANNOT_RUN", "exit_code_for_signal"]

EXIT_OK = 0
"""Every checked device passed."""
EXIT_CORRUPTION = 1
"""Corruption was found."""
EXIT_CANNOT_RUN = 2
"""Could not run: bad input, no device, golden data or suite suspect."""


def exit_code_for_signal(signum: int) -> int:
    """The exit code of work stopped by a signal: 128 + its number (130 SIGINT, 143 SIGTERM), as a shell reports a
    process the signal killed, so cron, systemd and Slurm see unfinished work, never "all passed"."""
    return 128 + int(signum)
