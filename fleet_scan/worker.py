"""One device's scan, in its own process: lock, idle check, golden cases until the budget, retests, records.

The parent (:mod:`fleet_scan.runner`) starts ``python -m fleet_scan.worker`` once per device with the target and
the :class:`~fleet_scan.options.ScanOptions` as JSON on stdin; the worker writes JSON-line events on stdout and
ends with a ``done`` event carrying its summary. A process per device pins a CPU scan to its core without
disturbing the others, keeps a crashed or hung device from taking the other scans with it, and lets the parent
stop one device (SIGTERM: the worker records what it has as ``interrupted``).

A failing case is retested :attr:`ScanOptions.retests` times in a *fresh* process (:mod:`fleet_scan.retest`):
a corrupted interpreter or a poisoned cache in this process cannot make the retest agree with it. The original
failure gets ``sticky=True`` when a retest failed again, ``False`` when every retest passed. Each failing case is
retested once per scan, while the retest still fits the budget (it is killed at the deadline otherwise), and no
more once a failure reproduced. Retest executions are recorded with ``attempt`` 1..N (the store's rates count
first attempts only).
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
from sdcguard.records import CaseResult, ScanStatus

from .discovery import ScanTarget
from .idle import DeviceLock, DeviceLocked, IdleMonitor
from .options import ScanOptions
from .record import ScanRecorder
from .schedule import Budget, CaseClock, next_case, order_cases
from .telemetry import telemetry_for

__all__ = ["scan_device", "make_backend", "make_hook", "load_worker_suite", "result_to_json", "result_from_json",
           "main"]

Emit = Callable[[dict[str, Any]], None]

_PROGRESS_EVERY_S = 0.5
_IDLE_CHECK_EVERY_S = 0.25
_RETEST_FIRST_GUESS_S = 1.0
"""Assumed cost of a fresh retest process before one was timed (interpreter, numpy, suite load, the runs)."""


def result_to_json(r: CaseResult) -> dict[str, Any]:
    return dataclasses.asdict(r)


def result_from_json(data: dict[str, Any]) -> CaseResult:
    return CaseResult(**data)


def make_backend(target: ScanTarget, suite: Any = None) -> Any:
    """The golden-suite backend of a target: numpy pinned to the core, or CuPy on the GPU."""
    if target.kind == "cpu":
        from sdcguard.golden import NumpyBackend

        return NumpyBackend(target.index, suite=suite)
    if target.kind == "gpu":
        try:
            from sdcguard.golden import CupyBackend
        except ImportError as e:
            raise SuiteError(f"{target.device}: this sdcguard has no CUDA golden-suite backend ({e})") from None
        # The worker's environment makes the target the only visible CUDA device (CUDA_VISIBLE_DEVICES=<uuid>):
        # NVML and CUDA may number GPUs differently, the UUID is unambiguous.
        return CupyBackend(0, suite=suite)
    raise SuiteError(f"{target.device}: no golden-suite backend for {target.kind} devices")


def make_hook(inject: str | None, target: ScanTarget) -> Callable[[str, Any], Any] | None:
    """The fire-drill output hook for a target (None without ``--inject`` or when no rule names it)."""
    if not inject:
        return None
    from sdcguard.inject.faults import golden_output_hook, parse_inject_spec

    # cuda:N in a rule means the GPU that `--device cuda:N` selects: NVML index N.
    cuda_index = target.index if target.kind == "gpu" else None
    return golden_output_hook(parse_inject_spec(inject), target.device, cuda_index=cuda_index)


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


def load_worker_suite(options: ScanOptions, references: str | None) -> Any:
    """The suite a worker (or a retest) runs: the references its parent built off this device when it handed
    them over (nothing is computed or hashed here, see :mod:`sdcguard.golden.references`), else the golden data
    loaded and checked here (a worker started by hand)."""
    if references:
        from sdcguard.golden.references import load_references

        return load_references(Path(references))
    from sdcguard.golden import load_suite

    return load_suite(None if options.golden_dir is None else Path(options.golden_dir))


def _run_retests(
    target: ScanTarget, options: ScanOptions, case_id: str, timeout_s: float, references: str | None
) -> tuple[list[CaseResult], str | None]:
    """Retest one case in a fresh process; (results, error)."""
    payload = {
        "target": target.to_json(),
        "case": case_id,
        "n": options.retests,
        "options": options.to_json(),
        "references": references,
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fleet_scan.retest"],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=max(timeout_s, 0.1),
        )
    except subprocess.TimeoutExpired:
        return [], f"retest did not finish within the remaining budget ({timeout_s:.1f} s)"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"retest process failed (exit {proc.returncode}): {tail}"
    try:
        return [result_from_json(d) for d in json.loads(proc.stdout)], None
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
    first_failure: dict[str, CaseResult] = dataclasses.field(default_factory=dict)
    """Each failing case's first failed execution (after its retest, if any)."""

    def failure_events(self, device: str) -> list[dict[str, Any]]:
        """One ``failure`` event per failing case of the scan: how often, and its first failing element."""
        return [
            {
                "event": "failure", "device": device, "case": r.case, "count": self.failing_cases[r.case],
                "seed": r.seed, "element": r.element, "mismatches": r.mismatches, "expected": r.expected,
                "actual": r.actual, "xor_mask": r.xor_mask, "location": r.location, "sticky": r.sticky,
            }
            for r in self.first_failure.values()
        ]


def scan_device(
    target: ScanTarget, options: ScanOptions, emit: Emit, *, references: str | None = None
) -> dict[str, Any]:
    """Scan one device; returns the ``done`` summary (also emitted). Raises nothing for device faults.

    ``references``: the directory of inputs and expected outputs the parent built off this device.
    """
    device = target.device
    summary: dict[str, Any] = {"event": "done", "device": device, "kind": target.kind}

    lock = DeviceLock(device, Path(options.lock_dir) if options.lock_dir else None)
    try:
        lock.acquire()
    except DeviceLocked as e:
        summary.update(status="locked", reason=str(e))
        emit(summary)
        return summary
    try:
        monitor = IdleMonitor(
            target,
            window_s=options.idle_window_s,
            gpu_util_max=options.gpu_util_max,
            cpu_busy_max=options.cpu_busy_max,
        )
        if options.only_idle:
            reason = monitor.busy_reason()
            if reason:
                # idle_error: the measurement that failed, when the device is busy because it could not be measured
                summary.update(status="busy", reason=reason, idle_error=monitor.error)
                emit(summary)
                return summary
        return _scan_locked(target, options, emit, monitor, summary, references)
    finally:
        lock.release()


def _scan_locked(
    target: ScanTarget, options: ScanOptions, emit: Emit, monitor: IdleMonitor, summary: dict[str, Any],
    references: str | None,
) -> dict[str, Any]:
    from sdcguard.fleet.store import Store

    device = target.device
    host = target.info.host or hostname()
    suite = load_worker_suite(options, references)
    backend = make_backend(target, suite)
    # the backend's own list: numpy skips GPU-only cases, CuPy adds the per-architecture ones
    runnable = list(backend.cases())
    if not runnable:
        raise SuiteError(f"{device}: the golden suite has no case this device's backend can run")
    hook = make_hook(options.inject, target)
    # Inputs, expected outputs, device buffers and kernels are built before the clock starts: the budget is spent
    # on executions, and the first execution of a case is timed like the others.
    prepare = getattr(backend, "prepare", None)
    if prepare is not None:
        prepare(tuple(runnable))

    telemetry = telemetry_for(target)
    with Store.open(options.db) as store:
        store.upsert_device(target.info)
        # We hold the device's lock: no other scanner on this host is scanning it now, so a scan of it still
        # `running` here was left by a killed scanner (the policy's time-based reaping would get there later).
        stale = store.reap(device=device, host=host)
        past = _past_failures(store, device)
        plan = order_cases(runnable, past)
        meta: dict[str, Any] = {
            "scanner_pid": os.getpid(),
            "host": host,
            "kind": target.kind,
            "index": target.index,
            "driver": target.driver,
            "only_idle": options.only_idle,
            "retests": options.retests,
            "inject": options.inject,
            "families_first": [f for f, n in sorted(past.items(), key=lambda kv: -kv[1]) if n],
            "stale_scans_interrupted": stale,
            "telemetry_before": telemetry.snapshot(),
        }
        budget = Budget(options.budget_s)
        budget.start()
        scan_id = store.begin_scan(device=device, host=host, budget_s=options.budget_s, meta=meta)
        recorder = ScanRecorder(store, scan_id)
        emit({"event": "start", "device": device, "scan": scan_id, "budget_s": options.budget_s})

        # SIGTERM/SIGINT (preemption by Slurm or Kubernetes, the parent giving up): finish the case in flight,
        # then record everything as `interrupted`. A flag, not an exception: a store write is never cut in half.
        stop: list[str] = []

        def _on_signal(signum: int, frame: Any) -> None:
            stop.append(signal.Signals(signum).name)

        old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        tally = _Tally()
        clock = CaseClock()
        retest_estimate = _RETEST_FIRST_GUESS_S
        retested: set[str] = set()
        status: ScanStatus = "complete"
        reason: str | None = None
        error: str | None = None
        position = 0
        last_progress = last_idle = time.monotonic()
        try:
            while True:
                if stop:
                    status, reason = "interrupted", f"stopped by {stop[0]}"
                    break
                if options.budget_s is None and position >= len(plan):
                    break  # no budget: exactly one pass
                budget.observe_flush(recorder.slowest_flush_s)
                picked = next_case(plan, position, budget, clock)
                if picked is None:
                    break
                case, position = picked
                now = time.monotonic()
                if options.only_idle and now - last_idle >= _IDLE_CHECK_EVERY_S:
                    last_idle = now
                    reason = monitor.job_appeared()
                    if reason:
                        status = "preempted"
                        break
                t0 = time.monotonic()
                r = _localize(target, backend.run(case, output_hook=hook))
                clock.observe(case.id, time.monotonic() - t0)
                tally.executions += 1
                if not r.passed:
                    tally.failures += 1
                    tally.failing_cases[r.case] = tally.failing_cases.get(r.case, 0) + 1
                    retests: list[CaseResult] = []
                    # Each failing case is retested once per scan, until one failure reproduced: the device is then
                    # known bad and further retests would only eat the budget the other cases need.
                    if (
                        options.retests
                        and not stop
                        and not tally.sticky
                        and r.case not in retested
                        and budget.fits(retest_estimate)
                    ):
                        retested.add(r.case)
                        t_re = time.monotonic()
                        retests, retest_error = _run_retests(target, options, r.case, budget.remaining(),
                                                                   references)
                        retest_estimate = max(retest_estimate, (time.monotonic() - t_re) * 1.2)
                        if retests:
                            sticky = any(not x.passed for x in retests)
                            r = dataclasses.replace(r, sticky=sticky)
                            if sticky:
                                tally.sticky.append(r.case)
                        else:
                            r = dataclasses.replace(r, detail={**r.detail, "retest_error": retest_error})
                    recorder.add(r)
                    tally.first_failure.setdefault(r.case, r)
                    for x in retests:
                        x = _localize(target, x)
                        tally.retest_runs += 1
                        recorder.add(dataclasses.replace(x, detail={**x.detail, "retest_of_started_at": r.started_at}))
                else:
                    recorder.add(r)
                if time.monotonic() - last_progress >= _PROGRESS_EVERY_S:
                    last_progress = time.monotonic()
                    emit(
                        {
                            "event": "progress",
                            "device": device,
                            "elapsed_s": round(budget.elapsed(), 3),
                            "executions": tally.executions,
                            "failures": tally.failures,
                        }
                    )
        except SdcguardError as e:  # the suite could not run: never a device fault
            status, error = "error", str(e)
        except Exception as e:  # a scanner bug: recorded as an error, the results so far are kept
            status, error = "error", f"{type(e).__name__}: {e}"
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        telemetry_after = telemetry.snapshot()
        telemetry.close()
        for event in tally.failure_events(device):
            emit(event)
        recorder.finish(status, meta={"telemetry_after": telemetry_after})
    summary.update(
        status=status,
        scan=scan_id,
        executions=tally.executions,
        failures=tally.failures,
        retest_runs=tally.retest_runs,
        failing_cases=tally.failing_cases,
        sticky_cases=tally.sticky,
        elapsed_s=round(budget.elapsed(), 3),
        budget_s=options.budget_s,
        reason=reason,
        idle_error=monitor.error,
        error=error,
        telemetry_after=telemetry_after,
    )
    emit(summary)
    return summary


def main() -> None:
    """``python -m fleet_scan.worker``: JSON {target, options} on stdin, JSON-line events on stdout."""
    payload = json.loads(sys.stdin.read())
    target = ScanTarget.from_json(payload["target"])
    options = ScanOptions.from_json(payload["options"])
    if target.kind == "cpu":
        # Onto our core before anything heavy (numpy, the suite): a sibling worker's start-up must not show up
        # as load on the core another worker is checking for idleness.
        try:
            os.sched_setaffinity(0, {target.index})
        except OSError:
            pass  # the backend reports an unusable core with a clear error

    parent_gone = False

    def emit(event: dict[str, Any]) -> None:
        # If the scanner that started us died, keep scanning and recording: the store is the real output.
        nonlocal parent_gone
        if parent_gone:
            return
        try:
            sys.stdout.write(json.dumps(event, default=str) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            parent_gone = True

    try:
        scan_device(target, options, emit, references=payload.get("references"))
    except SdcguardError as e:  # before the scan began (golden data, store): no scan recorded
        emit({"event": "done", "device": target.device, "status": "error", "error": str(e),
              "error_type": type(e).__name__})
        sys.exit(2)


if __name__ == "__main__":
    main()
