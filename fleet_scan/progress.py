"""Progress of a scan: a rich progress bar per device on a terminal, JSON lines otherwise (cron logs, CI, k8s).

Both take the workers' events (``start``, ``progress``, ``failure``, ``done``) and the runner's own (``skip``,
``policy``, ``summary``). A scan sends one ``failure`` event per failing case, when the scan ends: how many of its
executions failed, and the first one's element, bits, location and retest outcome (live counts ride on
``progress``). JSON lines are one object per line on stdout, every object with an ``event`` key.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO

__all__ = ["Reporter", "JsonReporter", "RichReporter", "make_reporter"]


class Reporter:
    """Receives events; thread-safe (one reader thread per worker feeds it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def event(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        raise NotImplementedError


class JsonReporter(Reporter):
    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self._stream = stream

    def _event(self, event: dict[str, Any]) -> None:
        stream = self._stream or sys.stdout
        stream.write(json.dumps(event, default=str, sort_keys=True) + "\n")
        stream.flush()


def _describe(event: dict[str, Any]) -> str:
    status = event.get("status")
    device = event.get("device")
    if status in ("locked", "busy"):
        return f"{device}: skipped ({event.get('reason')})"
    if status == "error" and "scan" not in event:
        return f"{device}: could not run: {event.get('error')}"
    text = (
        f"{device}: {status}, {event.get('executions', 0)} executions, {event.get('failures', 0)} failed"
        f" in {event.get('elapsed_s', 0):.1f} s"
    )
    if event.get("failing_cases"):
        text += " (" + ", ".join(f"{c} x{n}" for c, n in event["failing_cases"].items()) + ")"
    if event.get("sticky_cases"):
        text += "; reproduced on retest: " + ", ".join(event["sticky_cases"])
    if event.get("reason"):
        text += f"; {event['reason']}"
    if event.get("error"):
        text += f"; error: {event['error']}"
    return text


class RichReporter(Reporter):
    """A bar per device (elapsed against budget), failures printed as they come, one line per device at the end."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> RichReporter:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def _task(self, device: str, total: float | None) -> Any:
        if device not in self._tasks:
            self._tasks[device] = self._progress.add_task(device, total=total, stats="")
        return self._tasks[device]

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        device = str(event.get("device", ""))
        if kind == "start":
            self._task(device, event.get("budget_s"))
        elif kind == "progress":
            task = self._task(device, None)
            self._progress.update(
                task,
                completed=event.get("elapsed_s", 0),
                stats=f"{event.get('executions', 0)} runs, {event.get('failures', 0)} failed",
            )
        elif kind == "failure":
            count = event.get("count", 1)
            self._progress.console.print(
                f"[red]FAIL[/red] {device} {event.get('case')}: {count} failed execution{'s' if count != 1 else ''}; "
                f"first: seed={event.get('seed')} element={event.get('element')} expected={event.get('expected')} "
                f"actual={event.get('actual')} xor={event.get('xor_mask')} at {event.get('location')} "
                f"reproduced on retest={event.get('sticky')}"
            )
        elif kind == "done":
            if device in self._tasks:
                task = self._tasks[device]
                total = self._progress.tasks[task].total if task < len(self._progress.tasks) else None
                self._progress.update(
                    task,
                    completed=total or event.get("elapsed_s", 0),
                    stats=(
                        f"{event.get('executions', 0)} runs, {event.get('failures', 0)} failed, {event.get('status')}"
                    ),
                )
            self._progress.console.print(_describe(event))
        elif kind == "policy":
            for line in event.get("reasons", []):
                self._progress.console.print(f"policy: {line}")
            if event.get("quarantined"):
                self._progress.console.print(f"[red]quarantined:[/red] {', '.join(event['quarantined'])}")
            if event.get("breaker_tripped"):
                self._progress.console.print("[red]circuit breaker tripped: nobody quarantined[/red]")
        elif kind == "summary":
            self._progress.console.print(event.get("message", ""))
        elif kind == "message":
            self._progress.console.print(event.get("text", ""))


def make_reporter(json_lines: bool) -> Reporter:
    """JSON lines with ``--json`` or when stdout is not a terminal; else the rich progress bar."""
    if json_lines or not sys.stdout.isatty():
        return JsonReporter()
    return RichReporter()
