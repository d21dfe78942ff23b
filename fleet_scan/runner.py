"""The scan of one machine: pick devices, scan them in parallel (a worker process each), then apply the policy.

Before any device is touched the fire drill (parsed once, by the command line) is checked against the devices and
cases, the golden suite is loaded (its manifest's sha256 are verified: tampered golden data stops the scan with exit
2 before anything is recorded), the store is opened (created if needed, so the workers never race to create it; this
process's one connection, used again for the policy) and every case's inputs and expected output are built here, on a
core this scan does not test when there is one, checked against the manifest and handed to the workers
(:mod:`sdcguard.golden.references`): a device never computes its own reference. Each worker gets a
:class:`~fleet_scan.device_scan.requests.WorkerRequest` and answers with the events of :mod:`fleet_scan.events`.
After the workers the quarantine policy of :mod:`sdcguard.fleet.policy` runs over the scanned devices: quarantine,
circuit breaker, actions.

Exit codes (DESIGN.md): 0 every scanned device passed; 1 corruption found; 2 could not run (bad input, no
device, no device free to scan, a device scanned that executed nothing, golden data or suite suspect, circuit
breaker tripped); 128 + N when signal N
(SIGINT 130, SIGTERM 143) stopped the scan before it finished and found nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdcguard.errors import GoldenDataError
from sdcguard.exit_codes import EXIT_CANNOT_RUN, EXIT_CORRUPTION, EXIT_OK, exit_code_for_signal
from sdcguard.fleet.store.drills import drill_running
from sdcguard.fleet.store.schema.tables import MIN_EXECUTIONS

from .device_scan.requests import WorkerRequest
from .device_scan.summary import SKIPPED, DeviceSummary
from .devices.discovery import ScanTarget, select_targets
from .drill import check_drill
from .events import Message, PolicyApplied, ScanSummary, event_from_json
from .options import DEFAULT_BUDGET_S, ScanOptions
from .progress import Reporter
from .stop import on_stop_signals, shielded

if TYPE_CHECKING:
    from sdcguard.fleet.policy import PolicyScope
    from sdcguard.fleet.store.store import Store

__all__ = ["ScanOutcome", "run_scan", "worker_env", "reference_cores"]

_GRACE_S = 60.0
"""A worker still running this long after its budget (plus its idle window) is stopped (SIGTERM, then SIGKILL)."""


@dataclass
class ScanOutcome:
    """What one scanner invocation did."""

    devices: list[DeviceSummary]
    """The summary of every device (status, executions, failures, failing cases, sticky cases...)."""
    exit_code: int
    message: str
    """One line: what happened (the reason, for exit code 2)."""
    quarantined: list[str] = field(default_factory=list)
    breaker_tripped: bool = False
    policy_reasons: list[str] = field(default_factory=list)


def worker_env(target: ScanTarget) -> dict[str, str]:
    """Environment of a worker: one BLAS thread (a core scan uses its core only), the GPU by UUID, our path."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    if target.kind == "gpu":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = target.device  # GPU-<uuid>: unambiguous, whatever the numbering
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class _Worker:
    def __init__(self, target: ScanTarget, options: ScanOptions, reporter: Reporter, references: str) -> None:
        self.target = target
        self.summary: DeviceSummary | None = None
        self.stderr = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_scan.device_scan.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=worker_env(target),
        )
        assert self.proc.stdin is not None
        request = WorkerRequest(target=target, options=options, references=references)
        self.proc.stdin.write(json.dumps(request.to_json()))
        self.proc.stdin.close()
        self._reporter = reporter
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._out.start()
        self._err.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = event_from_json(json.loads(line))
            except (ValueError, TypeError):
                continue  # a stray print from a library: not an event
            if isinstance(event, DeviceSummary):
                self.summary = event
            self._reporter.event(event)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def wait(self, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)  # the worker records what it has as `interrupted`
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.join(timeout=5)
        self._err.join(timeout=5)

    def result(self, *, stopped_by: int | None = None) -> DeviceSummary:
        """The worker's summary; a worker that ended without one died (``error``), unless a stop signal
        (``stopped_by``) ended it: then it is ``interrupted``, like a scan the signal stopped."""
        if self.summary is not None:
            return self.summary
        if stopped_by is not None and self.proc.returncode in (-stopped_by, exit_code_for_signal(stopped_by)):
            name = signal.Signals(stopped_by).name
            return DeviceSummary(device=self.target.device, status="interrupted", reason=f"stopped by {name}")
        tail = (self.stderr.strip().splitlines() or [f"exit code {self.proc.returncode}"])[-1]
        return DeviceSummary(device=self.target.device, status="error", error=f"worker died: {tail}")


def _check_inputs(options: ScanOptions, targets: Sequence[ScanTarget]) -> Any:
    from sdcguard.golden import load_suite
    from sdcguard.golden.suite import check_suite_files

    suite = load_suite(Path(options.golden_dir) if options.golden_dir else None)
    if not suite.cases:
        raise GoldenDataError("the golden suite has no cases")
    # what `sdcguard golden verify` checks besides each case's golden (write_references checks those)
    check_suite_files(suite)
    if options.inject is not None:
        from sdcguard.golden.cases import CASES

        # the suite's portable cases, and the GPU-only ones a GPU's backend adds
        check_drill(options.inject.rules, targets, (*suite.cases, *(c for c in CASES if c.gpu_only)))
    return suite


def reference_cores(targets: Sequence[ScanTarget]) -> list[int]:
    """The cores to build references on, best first: those this scan does not test, then the others."""
    allowed = sorted(os.sched_getaffinity(0))
    tested = {t.index for t in targets if t.kind == "cpu"}
    return [c for c in allowed if c not in tested] + [c for c in allowed if c in tested]


_REFERENCES_PREFIX = "sdcguard-references-"
_REFERENCES_ROOM = 256 * 2**20


def _references_dir() -> str:
    """A private directory for this scan's references (in memory, /dev/shm, where it has room), named after
    this process. Directories a killed scanner left behind (SIGKILL runs no cleanup) are removed here first."""
    shm = Path("/dev/shm")
    # about 70 MB of references; a container's /dev/shm is often 64 MB: the temporary directory then
    parent = (
        shm
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > _REFERENCES_ROOM
        else Path(tempfile.gettempdir())
    )
    for old in parent.glob(f"{_REFERENCES_PREFIX}*"):
        pid = old.name[len(_REFERENCES_PREFIX) :].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_REFERENCES_PREFIX}{os.getpid()}-", dir=str(parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's scanner
    return True


def run_scan(
    options: ScanOptions,
    specs: Sequence[str] = (),
    *,
    reporter: Reporter,
    policy: Any = None,
    actions: Sequence[Any] = (),
    targets: Sequence[ScanTarget] | None = None,
    policy_scope: PolicyScope = "fleet",
) -> ScanOutcome:
    """Scan the devices named by ``specs`` (default: every GPU, else every CPU core) and apply the policy.

    Raises :class:`~sdcguard.errors.SdcguardError` (exit 2) for bad input, no device and suspect golden data;
    device faults never raise, they are in the outcome. A stop signal (Ctrl-C, SIGTERM) before any worker started
    raises ``KeyboardInterrupt`` at once (nothing was scanned or recorded; the command line exits 130); once the
    workers run, they get it and record their scans as ``interrupted`` (:class:`_Stop`).
    """
    stop = _Stop()
    with on_stop_signals(stop.handle):
        chosen = list(targets) if targets is not None else select_targets(specs)
        suite = _check_inputs(options, chosen)
        from sdcguard.golden.references import write_references

        # This process's one connection: the store is created (schema, WAL) here, before the workers open it
        # concurrently, and the policy reads and writes through it after them (None: a server that cannot be
        # reached, the workers write to their spool).
        store = _open_store(options.db, reporter, drill=options.inject is not None or drill_running())
        try:
            references = _references_dir()
            try:
                # Inputs and expected outputs are built here, off the devices under test, and checked against the
                # manifest; the workers only read them (sdcguard.golden.references).
                for note in write_references(suite, Path(references), cores=reference_cores(chosen)):
                    reporter.event(Message(text=note))
                summaries = _scan_all(options, chosen, reporter, references, stop)
            finally:
                shutil.rmtree(references, ignore_errors=True)
            return _conclude(summaries, reporter, store, policy, actions, policy_scope, stopped_by=stop.signal)
        finally:
            if store is not None:
                store.close()


class _Stop:
    """The runner's stop signals: before the workers start, the first one interrupts the scan where it is (it has
    written nothing yet; a store transaction in flight rolls back); while they run, it is passed on to them; after
    them, it only marks the outcome (the policy's one transaction completes)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.workers: list[_Worker] | None = None
        """None until the workers start; then the workers to pass a signal on to."""
        self.done = False

    def handle(self, signum: int) -> None:
        if self.signal is None:
            self.signal = signum
        if self.workers is None:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        if self.done:
            return
        # The workers get the signal we got (a Ctrl-C on a terminal reaches them as SIGINT already): each finishes
        # its case in flight and records its scan as `interrupted`, naming that signal.
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signum)


def _open_store(db: str, reporter: Reporter, *, drill: bool) -> Store | None:
    """The store of this process (a ``drill``'s: the drill store, :mod:`sdcguard.fleet.store.drills`); for a server,
    its spool forwarded first (what an earlier outage kept), and None (said) while it cannot be reached."""
    from sdcguard.entry import is_server_url
    from sdcguard.errors import StoreUnreachable
    from sdcguard.fleet.store.drills import open_for_drills, refuse_drill_store
    from sdcguard.fleet.store.spool import default_spool, forward_spool
    from sdcguard.fleet.store.store import Store

    if drill:
        return open_for_drills(db)
    if not is_server_url(db):
        store = Store.open(db)
        try:
            refuse_drill_store(store)
        except BaseException:
            store.close()
            raise
        return store
    try:
        store = Store.open(db)
    except StoreUnreachable as e:
        reporter.event(Message(text=f"{e}; the scan writes to the spool {default_spool(db)}"))
        return None
    sent = forward_spool(db)
    if sent is not None and (sent.scans or sent.incidents):
        reporter.event(Message(text=f"spool forwarded: +{sent.scans} scans, +{sent.results} results"))
    return store


def _scan_all(
    options: ScanOptions, chosen: list[ScanTarget], reporter: Reporter, references: str, stop: _Stop
) -> list[DeviceSummary]:
    """Every device's worker, until each ends or the deadline; their summaries."""
    workers: list[_Worker] = []
    with shielded():  # signals wait while the workers start (fleet_scan.stop), then reach them through `stop`
        stop.workers = workers
        for t in chosen:
            workers.append(_Worker(t, options, reporter, references))
    deadline = None
    if options.budget_s is not None:
        deadline = time.monotonic() + options.budget_s + options.idle_window_s * 2 + _GRACE_S
    for w in workers:
        w.wait(deadline)
    stop.done = True
    return [w.result(stopped_by=stop.signal) for w in workers]


def _conclude(
    summaries: list[DeviceSummary],
    reporter: Reporter,
    store: Store | None,
    policy: Any,
    actions: Sequence[Any],
    policy_scope: PolicyScope = "fleet",
    *,
    stopped_by: int | None = None,
) -> ScanOutcome:
    for s in summaries:
        if s.status == "error" and not s.scanned:
            reporter.event(s)  # a worker that died before its scan began sent no event of its own
    scanned = [s.device for s in summaries if s.scanned]
    errors = [f"{s.device}: {s.error}" for s in summaries if s.status == "error"]
    failures = sum(s.failures for s in summaries)

    outcome = ScanOutcome(devices=summaries, exit_code=EXIT_OK, message="")
    if scanned and (result := _apply_policy(store, reporter, policy, actions, scanned, policy_scope)) is not None:
        outcome.quarantined = list(result.quarantined)
        outcome.breaker_tripped = bool(result.breaker_tripped)
        outcome.policy_reasons = list(result.reasons)
        reporter.event(
            PolicyApplied(
                scope=policy_scope,
                quarantined=tuple(outcome.quarantined),
                breaker_tripped=outcome.breaker_tripped,
                reasons=tuple(outcome.policy_reasons),
            )
        )

    skipped = [s for s in summaries if s.status in SKIPPED]
    if outcome.breaker_tripped:
        outcome.exit_code = EXIT_CANNOT_RUN
        why = "; ".join(outcome.policy_reasons[:3]) or "the same wrong output on several devices"
        outcome.message = f"circuit breaker tripped, nobody quarantined: the suite or software is suspect ({why})"
    elif errors:
        outcome.exit_code = EXIT_CANNOT_RUN
        outcome.message = "could not run: " + "; ".join(errors)
    elif failures or stopped_by is None:
        _conclude_finished(outcome, summaries, scanned, skipped, failures, stopped_by)
    else:
        outcome.exit_code = exit_code_for_signal(stopped_by)
        outcome.message = _stopped_message(stopped_by, summaries)
    reporter.event(
        ScanSummary(
            exit_code=outcome.exit_code,
            message=outcome.message,
            scanned=tuple(scanned),
            skipped=tuple(s.device for s in skipped),
            quarantined=tuple(outcome.quarantined),
            breaker_tripped=outcome.breaker_tripped,
            stopped_by=None if stopped_by is None else signal.Signals(stopped_by).name,
        )
    )
    return outcome


def _stopped_message(signum: int, summaries: list[DeviceSummary]) -> str:
    name = signal.Signals(signum).name
    recorded = [s for s in summaries if s.scanned]
    executions = sum(s.executions for s in recorded)
    return (
        f"scan stopped by {name} before it finished: recorded as interrupted, {executions} execution(s) on "
        f"{len(recorded)} device(s) kept in the store, no failure among them; the devices were not fully checked"
    )


def _apply_policy(
    store: Store | None, reporter: Reporter, policy: Any, actions: Sequence[Any], scanned: list[str], scope: PolicyScope
) -> Any:
    """The quarantine policy over the scanned devices (its result). On a server store what the workers spooled is
    forwarded first; while the server cannot be reached the policy waits for the next run, which weighs the
    forwarded results (None)."""
    from sdcguard.errors import StoreUnreachable
    from sdcguard.fleet.policy import QuarantinePolicy, apply_policy
    from sdcguard.fleet.store.spool import forward_spool

    try:
        if store is None:
            raise StoreUnreachable("the fleet store's server could not be reached")
        if store.backend == "postgresql":
            forward_spool(str(store.path))
        return apply_policy(
            store, policy if policy is not None else QuarantinePolicy(), devices=scanned, actions=actions, scope=scope
        )
    except StoreUnreachable as e:
        reporter.event(Message(text=f"policy not applied (the results wait in the spool): {e}"))
        return None


def _conclude_finished(
    outcome: ScanOutcome,
    summaries: list[DeviceSummary],
    scanned: list[str],
    skipped: list[DeviceSummary],
    failures: int,
    stopped_by: int | None,
) -> None:
    """Exit code and message of a scan that found corruption, or that ran to its end."""
    if failures:
        outcome.exit_code = EXIT_CORRUPTION
        bad = [s.device for s in summaries if s.failures]
        outcome.message = (
            f"corruption found on {', '.join(bad)} ({failures} failed executions)"
            + (f"; quarantined: {', '.join(outcome.quarantined)}" if outcome.quarantined else "")
            + (f"; then stopped by {signal.Signals(stopped_by).name}" if stopped_by is not None else "")
        )
    elif empty := [s for s in summaries if s.scanned and not s.executions]:
        # A scan that executed no golden case tested nothing: "all passed" would be a lie, and the store never
        # counts it as a complete scan (sdcguard.fleet.store.schema.tables.COUNTED_SCAN), so it ends no probation
        # either.
        outcome.exit_code = EXIT_CANNOT_RUN
        why = "; ".join(
            f"{s.device}: 0 executions ({s.status}"
            + (f", {s.reason}" if s.reason else "")
            + (f", budget {s.budget_s:g} s" if s.budget_s is not None else "")
            + ")"
            for s in empty[:2]
        )
        more = f" (and {len(empty) - 2} more)" if len(empty) > 2 else ""
        outcome.message = (
            f"nothing was tested on {len(empty)} of {len(scanned)} scanned device(s) ({why}{more}): a scan counts "
            f"only when it ran at least {MIN_EXECUTIONS} golden case; raise --budget (the default is "
            f"{DEFAULT_BUDGET_S:g} s)"
        )
    elif not scanned and any(s.status == "busy" for s in skipped):
        # Nothing was checked because of other load: saying "all passed" (exit 0) would hide that the machine
        # went unscanned. (Devices only locked are being scanned by another scanner right now.)
        outcome.exit_code = EXIT_CANNOT_RUN
        busy = [s for s in skipped if s.status == "busy"]
        why = "; ".join(f"{s.device}: {s.reason or 'busy'}" for s in busy[:2])
        more = f" (and {len(skipped) - 2} more)" if len(skipped) > 2 else ""
        outcome.message = (
            f"no device scanned: every device asked for is busy with other work ({why}{more}); "
            "nothing was checked; pass --all to scan busy devices anyway"
        )
    else:
        outcome.message = f"{len(scanned)} device(s) scanned, all passed" + (
            f"; {len(skipped)} skipped (busy or locked; --all scans busy ones anyway)" if skipped else ""
        )
