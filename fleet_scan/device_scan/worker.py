"""One device's scan, in its own process: lock, idle check, golden cases until the budget, retests, records.

The parent (:mod:`fleet_scan.runner`) starts ``python -m fleet_scan.device_scan.worker`` once per device with a
:class:`~fleet_scan.device_scan.requests.WorkerRequest` (the target, the :class:`~fleet_scan.options.ScanOptions` with
the fire drill already parsed, the references) as JSON on stdin; the worker writes the events of
:mod:`fleet_scan.events` as JSON lines on stdout and ends with its summary (the ``done`` event). A process per
device pins a CPU scan to its core without disturbing the others, keeps a crashed or hung device from taking the
other scans with it, and lets the parent stop one device (SIGTERM: the worker records what it has as
``interrupted``).

A failing case is retested :attr:`ScanOptions.retests` times in a *fresh* process
(:mod:`fleet_scan.device_scan.retest`, which builds its backend and drill hook as this process does:
:mod:`fleet_scan.device_scan.backend`): a corrupted interpreter or a poisoned cache in this process cannot make the
retest agree with it. The original failure gets ``sticky=True`` when a retest failed again, ``False`` when every retest
passed. Each failing case is retested once per scan, while the retest still fits the budget (it is killed at the
deadline otherwise), and no more once a failure reproduced. Retest executions are recorded with ``attempt`` 1..N (the
store's rates count first attempts only).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdcguard.devices import hostname
from sdcguard.errors import SdcguardError, SuiteError
from sdcguard.exit_codes import EXIT_CANNOT_RUN
from sdcguard.records import CaseResult, ScanStatus

from ..devices.discovery import ScanTarget
from ..devices.idle import DeviceLock, DeviceLocked, IdleMonitor
from ..devices.telemetry import telemetry_for
from ..events import CaseFailed, Event, ScanProgress, ScanStarted
from ..options import ScanOptions
from ..stop import on_stop_signals, receive_stop_signals, shielded
from .backend import load_worker_suite, make_backend, make_hook
from .record import ScanRecorder
from .requests import RetestRequest, WorkerRequest, results_from_json
from .schedule import Budget, CaseClock, next_case, order_cases
from .summary import DeviceSummary

__all__ = ["scan_device", "main"]

Emit = Callable[[Event], None]

_PROGRESS_EVERY_S = 0.5
_IDLE_CHECK_EVERY_S = 0.25
_RETEST_FIRST_GUESS_S = 1.0
"""Assumed cost of a fresh retest process before one was timed (interpreter, numpy, suite load, the runs)."""


def _localize(target: ScanTarget, r: CaseResult) -> CaseResult:
    """A failure always says where it ran: the backend's location (SM, address) or at least the core/GPU."""
    if r.device != target.device:
        r = dataclasses.replace(r, device=target.device, detail={**r.detail, "backend_device": r.device})
    if not r.passed and not r.location:
        where = f"core:{target.index}" if target.kind == "cpu" else f"gpu:{target.index}"
        r = dataclasses.replace(r, location=where)
    return r


def _past_failures(store: Any, device: str) -> dict[str, int]:
    """Failures per family recorded for this device (any time): those families are scanned first."""
    from sdcguard.fleet.rates import device_rates

    rates = device_rates(store, devices=[device]).get(device)
    if rates is None:
        return {}
    return {family: r.failures for family, r in rates.families.items() if r.failures}


def _run_retests(
    target: ScanTarget, options: ScanOptions, case_id: str, timeout_s: float, references: str | None
) -> tuple[list[CaseResult], str | None]:
    """Retest one case in a fresh process; (results, error)."""
    request = RetestRequest(target=target, options=options, case=case_id, n=options.retests, references=references)
    try:
        with shielded():  # a Ctrl-C does not kill the retest half-way: the worker stops after it (fleet_scan.stop)
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleet_scan.device_scan.retest"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        with proc:
            try:
                out, err = proc.communicate(json.dumps(request.to_json()), timeout=max(timeout_s, 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
    except subprocess.TimeoutExpired:
        return [], f"retest did not finish within the remaining budget ({timeout_s:.1f} s)"
    if proc.returncode != 0:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return [], f"retest process failed (exit {proc.returncode}): {tail}"
    try:
        return results_from_json(json.loads(out)), None
    except (ValueError, TypeError) as e:
        return [], f"retest process gave unreadable output: {e}"


@dataclasses.dataclass
class _Tally:
    executions: int = 0
    """First attempts (what the rates count)."""
    failures: int = 0
    retest_runs: int = 0
    failing_cases: dict[str, int] = dataclasses.field(default_factory=dict)
    sticky: list[str] = dataclasses.field(default_factory=list)
    retested: set[str] = dataclasses.field(default_factory=set)
    """Cases retested in this scan (each at most once)."""
    first_failure: dict[str, CaseResult] = dataclasses.field(default_factory=dict)
    """Each failing case's first failed execution (after its retest, if any)."""

    def failure_events(self, device: str) -> list[CaseFailed]:
        """One ``failure`` event per failing case of the scan: how often, and its first failing element."""
        return [CaseFailed.first(device, r, self.failing_cases[r.case]) for r in self.first_failure.values()]


def scan_device(
    target: ScanTarget,
    options: ScanOptions,
    emit: Emit,
    *,
    references: str | None = None,
    stop: list[str] | None = None,
) -> DeviceSummary:
    """Scan one device; returns its summary (also emitted, as the ``done`` event). Raises nothing for device faults.

    ``references``: the directory of inputs and expected outputs the parent built off this device. ``stop``: the
    names of the stop signals received so far (the worker's process collects them from its start, see
    :mod:`fleet_scan.stop`): one received before the scan's loop ends the scan at its first case, ``interrupted``.
    """
    lock = DeviceLock(target.device, Path(options.lock_dir) if options.lock_dir else None)
    try:
        lock.acquire()
    except DeviceLocked as e:
        return _done(emit, DeviceSummary(device=target.device, kind=target.kind, status="locked", reason=str(e)))
    try:
        monitor = IdleMonitor(
            target, window_s=options.idle_window_s, gpu_util_max=options.gpu_util_max, cpu_busy_max=options.cpu_busy_max
        )
        if options.only_idle:
            reason = monitor.busy_reason()
            if reason:
                # idle_error: the measurement that failed, when the device is busy because it could not be measured
                return _done(
                    emit,
                    DeviceSummary(
                        device=target.device, kind=target.kind, status="busy", reason=reason, idle_error=monitor.error
                    ),
                )
        return _done(emit, _scan_locked(target, options, emit, monitor, references, [] if stop is None else stop))
    finally:
        lock.release()


def _done(emit: Emit, summary: DeviceSummary) -> DeviceSummary:
    emit(summary)
    return summary


def _scan_locked(
    target: ScanTarget, options: ScanOptions, emit: Emit, monitor: IdleMonitor, references: str | None, stop: list[str]
) -> DeviceSummary:
    """The scan of a device whose lock we hold: prepare, open, loop, finish."""
    from sdcguard.fleet.store.spool import open_writer

    scan = _DeviceScan(target, options, emit, monitor, references, stop)
    with open_writer(options.db) as store:  # a server store: its spool while the server cannot be reached
        scan.open(store)
        scan.loop()
        scan.finish()
    return scan.summary()


class _DeviceScan:
    """One device's scan, step by step. ``__init__`` prepares (suite, backend, cases, fire-drill hook: before the
    clock starts), :meth:`open` records the device and begins the scan, :meth:`loop` runs cases until the budget
    (retests included), :meth:`finish` records the end; :meth:`summary` is what the worker reports."""

    def __init__(
        self,
        target: ScanTarget,
        options: ScanOptions,
        emit: Emit,
        monitor: IdleMonitor,
        references: str | None,
        stop: list[str],
    ) -> None:
        self.target, self.options, self.emit, self.monitor, self.references = target, options, emit, monitor, references
        self.host = target.info.host or hostname()
        self.backend = make_backend(target, load_worker_suite(options, references))
        # the backend's own list: numpy skips GPU-only cases, CuPy adds the per-architecture ones
        self.runnable = list(self.backend.cases())
        if not self.runnable:
            raise SuiteError(f"{target.device}: the golden suite has no case this device's backend can run")
        self.hook = make_hook(options.inject, target)
        # Inputs, expected outputs, device buffers and kernels are built before the clock starts: the budget is
        # spent on executions, and the first execution of a case is timed like the others.
        prepare = getattr(self.backend, "prepare", None)
        if prepare is not None:
            prepare(tuple(self.runnable))
        self.telemetry = telemetry_for(target)
        self.budget = Budget(options.budget_s)
        self.tally = _Tally()
        self.stop = stop
        """Names of the stop signals received (see :mod:`fleet_scan.stop`)."""
        self.status: ScanStatus = "complete"
        self.reason: str | None = None
        self.error: str | None = None
        self.telemetry_after: dict[str, Any] | None = None
        self._retest_estimate = _RETEST_FIRST_GUESS_S

    def open(self, store: Any) -> None:
        """Record the device, reap its stale scans, order the cases (past failures first) and begin the scan."""
        device, options = self.target.device, self.options
        store.scans.record_devices([self.target.info])
        # We hold the device's lock: no other scanner on this host is scanning it now, so a scan of it still
        # `running` here was left by a killed scanner (the policy's time-based reaping would get there later).
        stale = store.scans.reap(device=device, host=self.host)
        past = _past_failures(store, device)
        self.plan = order_cases(self.runnable, past)
        meta: dict[str, Any] = {
            "scanner_pid": os.getpid(),
            "host": self.host,
            "kind": self.target.kind,
            "index": self.target.index,
            "driver": self.target.driver,
            "only_idle": options.only_idle,
            "retests": options.retests,
            "inject": None if options.inject is None else options.inject.text,
            "families_first": [f for f, n in sorted(past.items(), key=lambda kv: -kv[1]) if n],
            "stale_scans_interrupted": stale,
            "telemetry_before": self.telemetry.snapshot(),
        }
        self.budget.start()
        self.scan_id = store.scans.begin(device=device, host=self.host, budget_s=options.budget_s, meta=meta)
        self.recorder = ScanRecorder(store, self.scan_id)
        self.emit(ScanStarted(device=device, scan=self.scan_id, budget_s=options.budget_s))

    def loop(self) -> None:
        """Cases until the plan or the budget ends, a job appears (``preempted``) or a stop signal arrives
        (``interrupted``: a flag, not an exception, so a store write is never cut in half)."""
        options, clock = self.options, CaseClock()
        position = 0
        last_progress = last_idle = time.monotonic()
        with on_stop_signals(lambda signum: self.stop.append(signal.Signals(signum).name)):
            try:
                while True:
                    if self.stop:
                        self.status, self.reason = "interrupted", f"stopped by {self.stop[0]}"
                        break
                    if options.budget_s is None and position >= len(self.plan):
                        break  # no budget: exactly one pass
                    self.budget.observe_flush(self.recorder.slowest_flush_s)
                    picked = next_case(self.plan, position, self.budget, clock)
                    if picked is None:
                        break
                    case, position = picked
                    now = time.monotonic()
                    if options.only_idle and now - last_idle >= _IDLE_CHECK_EVERY_S:
                        last_idle = now
                        self.reason = self.monitor.job_appeared()
                        if self.reason:
                            self.status = "preempted"
                            break
                    t0 = time.monotonic()
                    r = _localize(self.target, self.backend.run(case, output_hook=self.hook))
                    clock.observe(case.id, time.monotonic() - t0)
                    self.tally.executions += 1
                    if r.passed:
                        self.recorder.add(r)
                    else:
                        self._failed(r)
                    if time.monotonic() - last_progress >= _PROGRESS_EVERY_S:
                        last_progress = time.monotonic()
                        self._progress()
            except SdcguardError as e:  # the suite could not run: never a device fault
                self.status, self.error = "error", str(e)
            except Exception as e:  # a scanner bug: recorded as an error, the results so far are kept
                self.status, self.error = "error", f"{type(e).__name__}: {e}"

    def _failed(self, r: CaseResult) -> None:
        """Record a failed execution, after its retest in a fresh process when one is due. Each failing case is
        retested once per scan, until one failure reproduced: the device is then known bad and further retests
        would only eat the budget the other cases need."""
        tally, options = self.tally, self.options
        tally.failures += 1
        tally.failing_cases[r.case] = tally.failing_cases.get(r.case, 0) + 1
        retests: list[CaseResult] = []
        if (
            options.retests
            and not self.stop
            and not tally.sticky
            and r.case not in tally.retested
            and self.budget.fits(self._retest_estimate)
        ):
            tally.retested.add(r.case)
            t_re = time.monotonic()
            retests, retest_error = _run_retests(self.target, options, r.case, self.budget.remaining(), self.references)
            self._retest_estimate = max(self._retest_estimate, (time.monotonic() - t_re) * 1.2)
            if retests:
                sticky = any(not x.passed for x in retests)
                r = dataclasses.replace(r, sticky=sticky)
                if sticky:
                    tally.sticky.append(r.case)
            else:
                r = dataclasses.replace(r, detail={**r.detail, "retest_error": retest_error})
        self.recorder.add(r)
        tally.first_failure.setdefault(r.case, r)
        for x in retests:
            x = _localize(self.target, x)
            tally.retest_runs += 1
            self.recorder.add(dataclasses.replace(x, detail={**x.detail, "retest_of_started_at": r.started_at}))

    def _progress(self) -> None:
        self.emit(
            ScanProgress(
                device=self.target.device,
                elapsed_s=round(self.budget.elapsed(), 3),
                executions=self.tally.executions,
                failures=self.tally.failures,
            )
        )

    def finish(self) -> None:
        """The telemetry after, one ``failure`` event per failing case, and the scan's final record."""
        self.telemetry_after = self.telemetry.snapshot()
        self.telemetry.close()
        for event in self.tally.failure_events(self.target.device):
            self.emit(event)
        self.recorder.finish(self.status, meta={"telemetry_after": self.telemetry_after})

    def summary(self) -> DeviceSummary:
        tally = self.tally
        return DeviceSummary(
            device=self.target.device,
            kind=self.target.kind,
            status=self.status,
            scan=self.scan_id,
            executions=tally.executions,
            failures=tally.failures,
            retest_runs=tally.retest_runs,
            failing_cases=dict(tally.failing_cases),
            sticky_cases=tuple(tally.sticky),
            elapsed_s=round(self.budget.elapsed(), 3),
            budget_s=self.options.budget_s,
            reason=self.reason,
            idle_error=self.monitor.error,
            error=self.error,
            telemetry_after=self.telemetry_after,
        )


def main() -> None:
    """``python -m fleet_scan.device_scan.worker``: a :class:`WorkerRequest` (JSON) on stdin, JSON-line events on
    stdout."""
    # Started shielded by the runner (fleet_scan.stop): a stop signal from now on is a flag the scan's loop reads.
    stop: list[str] = []
    with on_stop_signals(lambda signum: stop.append(signal.Signals(signum).name)):
        receive_stop_signals()
        _serve(stop)


def _serve(stop: list[str]) -> None:
    """Read the request, scan, emit the events; ``stop``: the stop signals received since the process began."""
    request = WorkerRequest.from_json(json.loads(sys.stdin.read()))
    target = request.target
    if target.kind == "cpu":
        # Onto our core before anything heavy (numpy, the suite): a sibling worker's start-up must not show up
        # as load on the core another worker is checking for idleness.
        try:
            os.sched_setaffinity(0, {target.index})
        except OSError:
            pass  # the backend reports an unusable core with a clear error

    parent_gone = False

    def emit(event: Event) -> None:
        # If the scanner that started us died, keep scanning and recording: the store is the real output.
        nonlocal parent_gone
        if parent_gone:
            return
        try:
            sys.stdout.write(json.dumps(event.to_json(), default=str) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            parent_gone = True

    try:
        scan_device(target, request.options, emit, references=request.references, stop=stop)
    except SdcguardError as e:  # before the scan began (golden data, store): no scan recorded
        emit(DeviceSummary(device=target.device, status="error", error=str(e), error_type=type(e).__name__))
        sys.exit(EXIT_CANNOT_RUN)


if __name__ == "__main__":
    main()
