"""``sdcguard launch -- torchrun ...``: run a launcher so that a guarded job's exit-code contract (86/85) reaches the
scheduler, with no traceback.

torchrun reports any failed worker as its own exit 1 and prints a ``ChildFailedError`` traceback; its agent also
stops every worker of the node when one exits non-zero. The guard's ranks write their verdicts to
``$SDCGUARD_VERDICT_FILE`` (:mod:`sdcguard.contract`), which this command sets; at the end it exits with the
contract's status from them (86 when a rank of this node left as a suspect, even if the job went on without it; 85
when the job left by the contract), and holds back torchrun's traceback of that failure (anything else it prints
passes through as it comes). No torch is imported here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

import click

from ...contract import VERDICT_FILE_ENV, contract_status, read_verdicts
from ...errors import BadInput
from ...exit_codes import exit_code_for_signal

__all__ = ["launch", "TracebackFilter"]


class TracebackFilter:
    """Passes a launcher's stderr through line by line, but holds back a traceback whose exception is torchrun's
    ``ChildFailedError`` together with everything after it (torchrun's failure summary, the last thing it prints);
    :meth:`held` is what was held back, for the end to print or drop. Any other traceback passes through once its
    exception line shows it is not torchrun's."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self._held: list[bytes] = []
        self._state = "normal"  # "traceback": holding one; "summary": torchrun's, held to the end

    def feed(self, line: bytes) -> None:
        if self._state == "summary":
            self._held.append(line)
        elif self._state == "traceback":
            self._held.append(line)
            if line[:1] not in (b" ", b"\t", b"\n", b"\r", b""):
                if b"ChildFailedError" in line:
                    self._state = "summary"
                else:
                    self._flush()
        elif line.startswith(b"Traceback (most recent call last):"):
            self._state, self._held = "traceback", [line]
        else:
            self._emit(line)

    def held(self) -> list[bytes]:
        return list(self._held)

    def _flush(self) -> None:
        for line in self._held:
            self._emit(line)
        self._held, self._state = [], "normal"

    def _emit(self, line: bytes) -> None:
        self.out.write(line)
        self.out.flush()


def _pump(stream: IO[bytes], sink: TracebackFilter) -> None:
    for line in iter(stream.readline, b""):
        sink.feed(line)


@click.command("launch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--verdict-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the ranks write their verdicts (emptied first; default: a temporary file, removed at the end).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def launch(verdict_file: Path | None, command: tuple[str, ...]) -> None:
    """Run COMMAND (a launcher: torchrun, srun, python ...) and exit by the guard's exit-code contract: 86 when a
    rank of this node left as a suspect (drain the node; the job may have gone on without it), 85 when the job
    left by the contract (restart it without the suspect node), else COMMAND's own status. torchrun's traceback of
    such an exit is replaced by one line.

    Example: sdcguard launch -- torchrun --nproc-per-node 8 --max-restarts 1 train.py
    """
    own = verdict_file is None
    if own:
        fd, name = tempfile.mkstemp(prefix="sdcguard-verdicts-", suffix=".jsonl")
        os.close(fd)
        path = Path(name)
    else:
        assert verdict_file is not None
        path = verdict_file
        try:
            path.write_text("", encoding="utf-8")
        except OSError as e:
            raise BadInput(f"--verdict-file {path}: cannot write it ({e.strerror})") from None
    try:
        returncode, held = _run(list(command), {**os.environ, VERDICT_FILE_ENV: str(path)})
        verdicts = read_verdicts(path)
    finally:
        if own:
            path.unlink(missing_ok=True)
    status = contract_status(verdicts, returncode)
    if not verdicts:
        for line in held:
            sys.stderr.buffer.write(line)
        sys.stderr.flush()
        sys.exit(status)
    first = next(v for v in verdicts if v.status == status)
    went_on = status == 86 and returncode == 0 and all(v.left for v in verdicts if v.status == 86)
    tail = " (the job went on without it)" if went_on else ""
    click.echo(f"sdcguard launch: exit {status}{tail}; a rank said: {first.message}", err=True)
    sys.exit(status)


def _run(command: list[str], env: dict[str, str]) -> tuple[int, list[bytes]]:
    """Run ``command`` with its stderr through a :class:`TracebackFilter`; a SIGINT or SIGTERM to this process
    is passed on to it. Its exit status (128 + N for a signal) and the lines held back."""
    try:
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    except OSError as e:
        raise BadInput(f"cannot run {command[0]}: {e.strerror}") from None
    sink = TracebackFilter(sys.stderr.buffer)
    assert child.stderr is not None
    pump = threading.Thread(target=_pump, args=(child.stderr, sink), daemon=True)
    pump.start()

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = child.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    pump.join()
    return (exit_code_for_signal(-returncode) if returncode < 0 else returncode), sink.held()
