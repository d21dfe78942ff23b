"""Progress of a scan: a rich progress bar per device on a terminal, JSON lines otherwise (cron logs, CI, k8s).

Both take the events of :mod:`fleet_scan.events`: the workers' (``start``, ``progress``, ``failure``, ``done``) and
the runner's own (``message``, ``policy``, ``summary``), and read their fields by name. A scan sends one ``failure``
event per failing case, when the scan ends: how many of its executions failed, and the first one's element, bits,
location and retest outcome (live counts ride on ``progress``). JSON lines are one object per line on stdout (each
event's ``to_json()``), every object with an ``event`` key.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO

from .device_scan.summary import DeviceSummary
from .events import CaseFailed, Event, Message, PolicyApplied, ScanProgress, ScanStarted, ScanSummary

__all__ = ["Reporter", "JsonReporter", "RichReporter", "make_reporter"]


class Reporter:
    """Receives events; thread-safe (one reader thread per worker feeds it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def event(self, event: Event) -> None:
        with self._lock:
            self._event(event)

    def _event(self, event: Event) -> None:
        raise NotImplementedError


class JsonReporter(Reporter):
    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self._stream = stream

    def _event(self, event: Event) -> None:
        stream = self._stream or sys.stdout
        stream.write(json.dumps(event.to_json(), default=str, sort_keys=True) + "\n")
        stream.flush()


def _describe(s: DeviceSummary) -> str:
    if s.status in ("locked", "busy"):
        return f"{s.device}: skipped ({s.reason})"
    if s.status == "error" and not s.scanned:
        return f"{s.device}: could not run: {s.error}"
    text = f"{s.device}: {s.status}, {s.executions} executions, {s.failures} failed in {s.elapsed_s or 0:.1f} s"
    if s.failing_cases:
        text += " (" + ", ".join(f"{c} x{n}" for c, n in s.failing_cases.items()) + ")"
    if s.sticky_cases:
        text += "; reproduced on retest: " + ", ".join(s.sticky_cases)
    if s.reason:
        text += f"; {s.reason}"
    if s.error:
        text += f"; error: {s.error}"
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

    def _event(self, event: Event) -> None:
        console = self._progress.console
        if isinstance(event, ScanStarted):
            self._task(event.device, event.budget_s)
        elif isinstance(event, ScanProgress):
            self._progress.update(
                self._task(event.device, None),
                completed=event.elapsed_s,
                stats=f"{event.executions} runs, {event.failures} failed",
            )
        elif isinstance(event, CaseFailed):
            console.print(_failure_line(event))
        elif isinstance(event, DeviceSummary):
            self._done(event)
            console.print(_describe(event))
        elif isinstance(event, PolicyApplied):
            for line in event.reasons:
                console.print(f"policy: {line}")
            if event.quarantined:
                console.print(f"[red]quarantined:[/red] {', '.join(event.quarantined)}")
            if event.breaker_tripped:
                console.print("[red]circuit breaker tripped: nobody quarantined[/red]")
        elif isinstance(event, ScanSummary):
            console.print(event.message)
        elif isinstance(event, Message):
            console.print(event.text)

    def _done(self, s: DeviceSummary) -> None:
        if s.device not in self._tasks:
            return
        task = self._tasks[s.device]
        total = self._progress.tasks[task].total if task < len(self._progress.tasks) else None
        self._progress.update(
            task, completed=total or s.elapsed_s or 0, stats=f"{s.executions} runs, {s.failures} failed, {s.status}"
        )


def _failure_line(e: CaseFailed) -> str:
    return (
        f"[red]FAIL[/red] {e.device} {e.case}: {e.count} failed execution{'s' if e.count != 1 else ''}; "
        f"first: seed={e.seed} element={e.element} expected={e.expected} actual={e.actual} xor={e.xor_mask} "
        f"at {e.location} reproduced on retest={e.sticky}"
    )


def make_reporter(json_lines: bool) -> Reporter:
    """JSON lines with ``--json`` or when stdout is not a terminal; else the rich progress bar."""
    if json_lines or not sys.stdout.isatty():
        return JsonReporter()
    return RichReporter()
