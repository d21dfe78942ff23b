"""The quarantine policy: which devices to take out of service, and where each rule runs.

Rules need different views, so the policy runs in two places (``scope``):

- **node** (the scanner, after each scan, on its node's own store): a failure reproduced on retest (sticky),
  but only when another device of the same node passed the same case within ``breaker_window_s`` of it (it ran
  the same golden file with the same software on the same host, so neither can be what is wrong), no other
  device of the node gave the same wrong output, and that output is not one the case passes with (a device
  computing what an older golden file expects). Then the node needs nobody else's data to act: the node is
  drained now, not at the next merge. Everything else is left to the fleet: one node cannot tell a bad golden
  file or a batch of devices sharing one defect from faulty devices, and has too few devices for a rate of
  failures across devices to mean anything.
- **fleet** (the merge job, on the merged store, or the scanner on a store nobody merges): every rule, evaluated
  in this order:

  1. Stale ``running`` scans are reaped (``interrupted``).
  2. The circuit breakers (:mod:`.breaker`): failures the suite or the software is blamed for are never
     evidence, and while such failures are inside ``breaker_window_s`` nobody is quarantined in that run (the
     outcome says why). Training incidents of a job that named too many devices are never evidence either.
  3. A device is quarantined on a sticky failure, on ``rate_low`` above ``rate_threshold`` at ``confidence``,
     or on ``incident_threshold`` attributed training incidents naming it in the window.
  4. Probation (after a manual release): any failure since the release re-quarantines the device;
     ``probation_clean_scans`` complete clean scans end it.

Every decision is recorded with its reason (``policy_decisions``, and each quarantine in ``quarantine_history``)
in one transaction; then the action templates run for quarantined devices whose actions have not succeeded yet.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..durations import DAY_S, DEFAULT_WINDOW_S
from .actions import ActionTemplate, run_action
from .breaker import SuiteVerdict, judge_suite, judge_training
from .rates import clopper_pearson_arrays
from .slow import SlowSettings
from .slow_fleet import fleet_slowness
from .store.rows import Decision, FailedExecution
from .store.store import Store

__all__ = ["QuarantinePolicy", "PolicyOutcome", "Decision", "PolicyScope", "apply_policy"]

PolicyScope = Literal["fleet", "node"]
"""``node``: the rules a node's own store can decide alone; ``fleet``: every rule (see the module docstring)."""


@dataclass(frozen=True, kw_only=True)
class QuarantinePolicy:
    """When to quarantine a device. Defaults suit a fleet where healthy hardware never fails a golden case."""

    window_s: float = DEFAULT_WINDOW_S
    """Look-back window for rates and incidents (7 days)."""
    confidence: float = 0.95
    """Confidence of the one-sided Clopper–Pearson lower bound compared with ``rate_threshold``."""
    rate_threshold: float = 1e-4
    """Quarantine when ``rate_low`` exceeds this (one failure in 10,000 executions). The lower bound sits below
    the true rate, so the threshold must sit well below the rates worth catching; healthy devices (rare
    transients) still need two failures within ~3,500 executions to cross it (``benchmarks/fleet_policy.py``)."""
    quarantine_on_sticky: bool = True
    """Quarantine on any failure reproduced on retest (``CaseResult.sticky``)."""
    incident_threshold: int = 2
    """Quarantine a device named alone by at least this many training incidents in the window (0: off)."""
    incident_breaker_devices: int = 3
    """Training breaker: one job's incidents naming at least this many distinct devices, none of them sticky, ..."""
    incident_breaker_share: float = 0.25
    """... and at least this share of the devices the job's guard watched (``Incident.job_size``; unknown for
    incidents of older versions, which then need the count alone) leave the pattern software leaves, not faulty
    hardware: none of that job's transient incidents count. Three faulty devices in a job of 10,000 do not trip
    it."""
    breaker_window_s: float = DAY_S
    """Window of the circuit breaker (1 day), and the time bucket of its share rule."""
    breaker_same_digest_devices: int = 2
    """A wrong output (digest) shared by this many devices is weighed by the breaker (suite or shared defect)."""
    breaker_share: float = 0.25
    """Trip when more than this share of the devices that ran one case in one bucket failed it ..."""
    breaker_min_devices: int = 3
    """... and at least this many did (so one bad core of a 4-core host does not trip it)."""
    probation_clean_scans: int = 3
    """Complete scans without a failure that end a probation after a manual release."""
    reap_grace_s: float = 600.0
    """A ``running`` scan older than its budget plus this is marked ``interrupted``."""
    slow_threshold: float = 0.2
    """A device is slow when the lower confidence bound (at ``confidence``) of its time for the golden cases over
    its peers' median time exceeds ``1 + slow_threshold`` (:mod:`.slow`); a training job's ``slow`` incident says
    the same. Recorded as a decision ``slow``, shown beside the status; never evidence of corruption."""
    slow_drain: bool = False
    """Also quarantine a slow device (the actions drain it). Off: a slow device computes right answers; the
    report, the HTML page and Prometheus show it, and the decision is recorded."""

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.breaker_window_s <= 0:
            raise ValueError("windows must be > 0 seconds")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if not 0 <= self.rate_threshold < 1:
            raise ValueError(f"rate_threshold must be in [0, 1), got {self.rate_threshold}")
        if not 0 < self.breaker_share <= 1 or not 0 < self.incident_breaker_share <= 1:
            raise ValueError("breaker_share and incident_breaker_share must be in (0, 1]")
        if self.breaker_same_digest_devices < 2:
            raise ValueError("breaker_same_digest_devices must be >= 2")
        if self.incident_breaker_devices < 2:
            raise ValueError("incident_breaker_devices must be >= 2")
        if not 0 < self.slow_threshold < 10:
            raise ValueError(f"slow_threshold must be in (0, 10), got {self.slow_threshold}")
        if self.incident_threshold < 0 or self.probation_clean_scans < 0 or self.breaker_min_devices < 1:
            raise ValueError("incident_threshold, probation_clean_scans must be >= 0, breaker_min_devices >= 1")


@dataclass(kw_only=True)
class PolicyOutcome:
    """What one :func:`apply_policy` run decided and did."""

    scope: PolicyScope = "fleet"
    quarantined: list[str] = field(default_factory=list)
    """Devices quarantined by this run."""
    breaker_tripped: bool = False
    """The scanner's circuit breaker tripped: the suite or the software is suspect."""
    training_breaker_jobs: list[str] = field(default_factory=list)
    """Jobs whose training incidents named too many devices (their incidents quarantine nobody)."""
    reasons: list[str] = field(default_factory=list)
    """One sentence per decision (and why a breaker tripped)."""
    released: list[str] = field(default_factory=list)
    """Devices whose probation ended in this run."""
    decisions: list[Decision] = field(default_factory=list)
    actions_ok: list[tuple[str, str]] = field(default_factory=list)
    """``(device, action name)`` that succeeded in this run."""
    actions_failed: list[tuple[str, str]] = field(default_factory=list)
    """``(device, action name)`` that failed in this run (retried next run)."""
    reaped: int = 0
    """Stale ``running`` scans marked ``interrupted``."""
    slow: list[str] = field(default_factory=list)
    """Devices found newly slow by this run (a ``slow`` decision each)."""


def _node_candidates(store: Store, policy: QuarantinePolicy, t: float, devices: Sequence[str] | None) -> dict[str, str]:
    if not policy.quarantine_on_sticky:
        return {}
    failures = store.failures.executions(since=t - policy.window_s)
    scope = None if devices is None else set(devices)
    sticky = [f for f in failures if f.sticky and (scope is None or f.device in scope)]
    if not sticky:
        return {}
    shared: dict[tuple[str, str], set[str]] = {}
    for f in failures:
        if f.digest:
            shared.setdefault((f.case, f.digest), set()).add(f.device)
    cases = {f.case for f in sticky}
    passers = store.failures.case_passers(cases, since=min(f.started_at for f in sticky) - policy.breaker_window_s)
    passes = store.failures.pass_digests(cases)
    found: dict[str, str] = {}
    for f in sticky:
        peers = sorted(passers[f.case] - {f.device})
        if (
            not peers
            or f.device in found
            or (f.digest or "") in passes[f.case]
            or len(shared.get((f.case, f.digest or ""), ())) > 1
        ):
            continue  # the fleet's view is needed (see the module docstring)
        found[f.device] = (
            f"sticky failure: case {f.case} failed and the failure reproduced on retest, while {peers[0]} on the "
            "same node passed it (the golden data and the software there are sound)"
        )
    return found


def _fleet_candidates(
    store: Store,
    policy: QuarantinePolicy,
    t: float,
    devices: Sequence[str] | None,
    evidence: list[FailedExecution],
    verdict: SuiteVerdict,
    incident_counts: dict[str, int],
) -> dict[str, str]:
    since = t - policy.window_s
    scope = None if devices is None else set(devices)
    mine = [f for f in evidence if f.started_at >= since and (scope is None or f.device in scope)]
    found: dict[str, str] = {}

    def add(device: str, reason: str) -> None:
        found.setdefault(device, reason)

    if policy.quarantine_on_sticky:
        for f in mine:
            if f.sticky:
                shared = verdict.shared.get((f.case, f.digest or ""))
                add(
                    f.device,
                    f"sticky failure: case {f.case} failed and the failure reproduced on retest"
                    + (f" ({shared})" if shared else ""),
                )
    k = Counter(f.device for f in mine)
    if k:
        tallies = store.counts.tallies(since=since, devices=sorted(k), by="device")
        n = [t_.executions for t_ in tallies]
        # tallies by device have a device (Tally's fields are optional for other groupings)
        low, _ = clopper_pearson_arrays([k[t_.device] for t_ in tallies], n, policy.confidence)  # type: ignore[index]
        for t_, lo in zip(tallies, low.tolist()):
            if lo > policy.rate_threshold:
                assert t_.device is not None
                add(
                    t_.device,
                    f"failure rate {k[t_.device]}/{t_.executions}: lower {policy.confidence:.0%} bound "
                    f"{lo:.3g} exceeds threshold {policy.rate_threshold:.3g}",
                )
    if policy.incident_threshold > 0:
        for dev, count in sorted(incident_counts.items()):
            if count >= policy.incident_threshold and (scope is None or dev in scope):
                add(dev, f"{count} training incidents named it alone in the last {policy.window_s / DAY_S:g} days")
    return found


def apply_policy(
    store: Store,
    policy: QuarantinePolicy | None = None,
    *,
    devices: Sequence[str] | None = None,
    now: float | None = None,
    actions: Sequence[ActionTemplate] = (),
    scope: PolicyScope = "fleet",
) -> PolicyOutcome:
    """Decide quarantines for ``devices`` (default: every device), record every decision, run ``actions``.

    The circuit breakers look at the whole store even when ``devices`` is given: a suite problem is never local.
    """
    policy = policy or QuarantinePolicy()
    t = time.time() if now is None else now
    out = PolicyOutcome(scope=scope)
    out.reaped = store.scans.reap(grace_s=policy.reap_grace_s, now=t)
    notes: list[Decision] = []
    passed: dict[str, str] = {}
    if scope == "node":
        found = _node_candidates(store, policy, t, devices)
    else:
        found, passed = _fleet_rules(store, policy, t, devices, notes, out)
    recorded = store.quarantine.record_policy_run(now=t, notes=notes, quarantine=found, passed_probation=passed)
    for d in recorded:
        out.decisions.append(d)
        out.reasons.append(d.reason)
        if d.decision == "quarantine":
            assert d.device is not None
            out.quarantined.append(d.device)
        elif d.decision == "probation_passed":
            assert d.device is not None
            out.released.append(d.device)
        elif d.decision == "slow":
            assert d.device is not None
            out.slow.append(d.device)
    if actions:
        _run_actions(store, actions, out, t)
    return out


def _fleet_rules(
    store: Store,
    policy: QuarantinePolicy,
    t: float,
    devices: Sequence[str] | None,
    notes: list[Decision],
    out: PolicyOutcome,
) -> tuple[dict[str, str], dict[str, str]]:
    """The fleet's rules: ``(device -> why quarantine, device -> why probation ends)``; breaker notes appended."""
    since = min(t - policy.window_s, t - policy.breaker_window_s)
    failures = store.failures.executions(since=since)
    verdict = judge_suite(store, failures, policy, now=t, since=since)
    evidence = [f for f in failures if not verdict.is_suspect(f)]
    training = judge_training(store.training.incidents(since=t - policy.window_s), policy)
    notes.extend(Decision(device=None, decision="breaker", reason=why) for why in verdict.trips)
    notes.extend(
        Decision(device=None, decision="training_breaker", reason=why) for why in training.tripped_jobs.values()
    )
    out.breaker_tripped = bool(verdict.trips)
    out.training_breaker_jobs = sorted(training.tripped_jobs)
    found: dict[str, str] = {}
    slow = _slow_rule(store, policy, t, devices, notes)
    if not verdict.trips:
        states = store.quarantine.states()
        found = {
            d: why
            for d, why in {
                **slow,
                **_fleet_candidates(store, policy, t, devices, evidence, verdict, training.counts),
            }.items()
            if states.get(d) != "quarantined"
        }
    # Probation: any evidence failure since the release brings the device back into quarantine.
    probation = {
        e.device: e.since
        for e in store.quarantine.entries()
        if e.state == "probation" and (devices is None or e.device in devices)
    }
    if not verdict.trips:
        for f in evidence:
            if f.device in probation and f.started_at >= probation[f.device]:
                found[f.device] = f"failed case {f.case} while on probation after a manual release"
    clean = store.counts.clean_scans(probation)
    passed = {
        dev: f"{n} clean complete scans since the release (policy needs {policy.probation_clean_scans})"
        for dev, n in sorted(clean.items())
        if n >= policy.probation_clean_scans and dev not in found
    }
    return found, passed


def _slow_rule(
    store: Store, policy: QuarantinePolicy, t: float, devices: Sequence[str] | None, notes: list[Decision]
) -> dict[str, str]:
    """Note a ``slow`` decision for each device newly slow in the window (not already noted in it); with
    ``slow_drain``, the devices to quarantine for it."""
    since = t - policy.window_s
    verdicts = fleet_slowness(  # kept for the reports over the same window (sdcguard report --slow-max-age)
        store,
        since=since,
        devices=devices,
        settings=SlowSettings(threshold=policy.slow_threshold, confidence=policy.confidence),
        now=t,
        keep=True,
    )
    noted = {d.device for d in store.quarantine.decisions(since=since) if d.decision == "slow"}
    drain: dict[str, str] = {}
    for device, v in sorted(verdicts.items()):
        if not v.slow:
            continue
        why = f"slow ({v.basis}, {v.confidence} confidence): {v.reason}"
        if device not in noted:
            notes.append(Decision(device=device, decision="slow", reason=why))
        if policy.slow_drain:
            drain[device] = why + "; slow_drain is on"
    return drain


def _run_actions(store: Store, actions: Sequence[ActionTemplate], out: PolicyOutcome, t: float) -> None:
    # Commands run outside any transaction (a slow kubectl must not hold the store's write lock). Two policy
    # runs at the same moment may both run a pending action: drain/taint/cordon commands are idempotent.
    by_name = {a.name: a for a in actions}
    for row in store.quarantine.pending_actions(sorted(by_name), now=t):
        template = by_name.get(row.action)
        if template is None:
            continue  # a template no longer configured: left pending, not run
        result = run_action(template, device=row.device, host=row.host, reason=row.reason)
        kind = "action_ok" if result.ok else "action_failed"
        # An action that never ran (a timeout, a missing program) has no exit status: its output says why.
        status = "" if result.returncode is None else f"exit {result.returncode}: "
        why = f"{row.device}: action {template.name} " + (
            "succeeded" if result.ok else f"failed ({status}{result.output.strip()[-200:]}); retried next run"
        )
        decision = Decision(device=row.device, decision=kind, reason=why)
        store.quarantine.record_action_attempt(
            row.id,
            argv=result.argv,
            returncode=result.returncode,
            ok=result.ok,
            output=result.output,
            now=t,
            decision=decision,
        )
        out.decisions.append(decision)
        out.reasons.append(why)
        (out.actions_ok if result.ok else out.actions_failed).append((row.device, template.name))
