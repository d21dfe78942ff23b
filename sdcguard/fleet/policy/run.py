"""A policy run (:func:`apply_policy`): reap stale scans, read what the rules weigh at once (:func:`read_inputs`),
decide (:func:`~.rules.decide`, pure), record the decisions in one write, keep the slowness verdicts for the
reports, and run the actions of the devices quarantined."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..actions import ActionTemplate, run_action
from ..breaker import read_suite_evidence
from ..slow_fleet import keep_verdicts, read_slowness
from ..store.rows import Decision
from .rules import PolicyInputs, decide
from .settings import PolicyScope, QuarantinePolicy

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = ["PolicyOutcome", "read_inputs", "apply_policy"]


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


def read_inputs(
    store: Store, policy: QuarantinePolicy, *, now: float, devices: Sequence[str] | None, scope: PolicyScope
) -> PolicyInputs:
    """Everything the rules of ``scope`` weigh for ``devices`` (None: every device) at ``now``, read from the store
    once, each read taking the job it needs. Some reads follow from earlier ones (the buckets the breaker counts
    devices in are those of the failures read), none from a decision."""
    scoped = None if devices is None else frozenset(devices)
    window = now - policy.window_s
    releases = store.quarantine.releases()
    if scope == "node":
        if not policy.quarantine_on_sticky:
            return PolicyInputs(now=now, scope=scope, devices=scoped)
        failures = tuple(store.failures.executions(since=window))
        sticky = [f for f in failures if f.sticky and (scoped is None or f.device in scoped)]
        if not sticky:
            return PolicyInputs(now=now, scope=scope, devices=scoped, failures=failures, releases=releases)
        cases = {f.case for f in sticky}
        passers = store.failures.case_passers(cases, since=min(f.started_at for f in sticky) - policy.breaker_window_s)
        return PolicyInputs(
            now=now,
            scope=scope,
            devices=scoped,
            failures=failures,
            releases=releases,
            passers={c: frozenset(d) for c, d in passers.items()},
            pass_digests={c: frozenset(d) for c, d in store.failures.pass_digests(cases).items()},
        )
    since = min(window, now - policy.breaker_window_s)
    failures = tuple(store.failures.executions(since=since))
    failing = sorted({f.device for f in failures if f.started_at >= window and (scoped is None or f.device in scoped)})
    # a device released in the window is rated on its executions since the release
    late = [d for d in failing if releases.get(d, window) > window]
    plain = [d for d in failing if d not in late]
    tallies = store.counts.tallies(since=window, devices=plain, by="device") if plain else []
    for d in late:
        tallies += store.counts.tallies(since=releases[d], devices=[d], by="device")
    quarantine = tuple(store.quarantine.entries())
    probation = {
        e.device: e.since for e in quarantine if e.state == "probation" and (scoped is None or e.device in scoped)
    }
    return PolicyInputs(
        now=now,
        scope=scope,
        devices=scoped,
        failures=failures,
        suite=read_suite_evidence(failures, policy, source=store.failures, since=since),
        executions={t.device: t.executions for t in tallies if t.device is not None},
        incidents=tuple(store.training.incidents(since=window)),
        quarantine=quarantine,
        clean_scans=store.counts.clean_scans(probation),
        slowness=read_slowness(store, since=window, settings=policy.slow_settings),
        releases=releases,
        diagnostics=store.diagnostics.failed(since=window) if policy.dcgm_failures else {},
        nvml=store.hardware.events(since=window, devices=devices) if policy.nvml_errors else (),
        slow_noted=frozenset(
            d.device for d in store.quarantine.decisions(since=window) if d.decision == "slow" and d.device is not None
        ),
    )


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
    reaped = store.scans.reap(grace_s=policy.reap_grace_s, now=t)
    verdict = decide(read_inputs(store, policy, now=t, devices=devices, scope=scope), policy)
    if verdict.slowness is not None:  # kept for the reports over the same window (sdcguard report --slow-max-age)
        keep_verdicts(store, verdict.slowness, since=t - policy.window_s, now=t, settings=policy.slow_settings)
    recorded = store.quarantine.record_policy_run(
        now=t, notes=verdict.notes, quarantine=verdict.quarantine, passed_probation=verdict.passed_probation
    )
    out = PolicyOutcome(
        scope=scope,
        reaped=reaped,
        breaker_tripped=verdict.breaker_tripped,
        training_breaker_jobs=list(verdict.training_breaker_jobs),
        decisions=list(recorded),
        reasons=[d.reason for d in recorded],
        quarantined=[d.device for d in recorded if d.decision == "quarantine" and d.device is not None],
        released=[d.device for d in recorded if d.decision == "probation_passed" and d.device is not None],
        slow=[d.device for d in recorded if d.decision == "slow" and d.device is not None],
    )
    if actions:
        _run_actions(store, actions, out, t)
    return out


def _run_actions(store: Store, actions: Sequence[ActionTemplate], out: PolicyOutcome, t: float) -> None:
    """Run the actions of every quarantined device whose actions have not succeeded yet; each attempt and the
    decision that says how it went recorded at once, and added to ``out``."""
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
