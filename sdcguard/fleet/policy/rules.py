"""The quarantine policy's rules as one pure function: :func:`decide` turns what a run read (:class:`PolicyInputs`)
and the settings into what it decides (:class:`PolicyVerdict`), with no store in reach, as the training side's
verdicts are decided. The rules and their order are :mod:`sdcguard.fleet.policy`'s docstring.

To weigh a new kind of evidence: add its field to :class:`PolicyInputs` (with an empty default for the scope that
does not read it), read it in :func:`~.run.read_inputs`, weigh it here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...durations import DAY_S, iso_utc
from ...records import Incident
from ..breaker import SuiteEvidence, SuiteVerdict, judge_suite, judge_training
from ..nvml import hardware_events
from ..rates import clopper_pearson_arrays
from ..slow import Slowness
from ..slow_fleet import SlownessInputs, judge_fleet, with_training
from ..store.rows import Decision, DiagSummary, FailedExecution, NvmlScan, QuarantineEntry
from .settings import PolicyScope, QuarantinePolicy

__all__ = ["PolicyInputs", "PolicyVerdict", "decide"]

_NOTHING = SuiteEvidence(coverage={}, passes={})


@dataclass(frozen=True, kw_only=True)
class PolicyInputs:
    """Everything one policy run weighs, read from the store at once (:func:`~.run.read_inputs`)."""

    now: float
    """When the run decides (its windows end here)."""
    scope: PolicyScope
    devices: frozenset[str] | None
    """The devices decided for (None: every device); the breakers weigh every device's failures whatever it is."""
    failures: tuple[FailedExecution, ...] = ()
    """Every device's failed first attempts since the evidence window's start: the policy's window, or (fleet) the
    breaker's when it is longer. (Node, ``quarantine_on_sticky`` off: none read.)"""
    passers: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """(node) Each case a sticky failure of ``devices`` failed -> the devices that passed it since a breaker window
    before the first such failure."""
    pass_digests: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """(node) Each of those cases -> every output it passed with."""
    suite: SuiteEvidence = _NOTHING
    """(fleet) What the breaker weighs beside the failures (:func:`~..breaker.read_suite_evidence`)."""
    executions: Mapping[str, int] = field(default_factory=dict)
    """(fleet) Each device of ``devices`` that failed in the window -> its first-attempt executions there."""
    incidents: tuple[Incident, ...] = ()
    """(fleet) Training incidents in the window."""
    quarantine: tuple[QuarantineEntry, ...] = ()
    """(fleet) Every device quarantined or on probation."""
    clean_scans: Mapping[str, int] = field(default_factory=dict)
    """(fleet) Each device of ``devices`` on probation -> its complete clean scans since its release."""
    slowness: SlownessInputs | None = None
    """(fleet) What the slowness rule weighs (:func:`~..slow_fleet.read_slowness`)."""
    slow_noted: frozenset[str] = frozenset()
    """(fleet) The devices a ``slow`` decision in the window already names."""
    releases: Mapping[str, float] = field(default_factory=dict)
    """Each device released by hand -> when it last was: evidence from before that never quarantines it again."""
    diagnostics: Mapping[str, DiagSummary] = field(default_factory=dict)
    """(fleet, ``dcgm_failures`` on) Each device whose latest DCGM diagnostic in the window failed a test."""
    nvml: tuple[NvmlScan, ...] = ()
    """(fleet, ``nvml_errors`` on) The GPUs' scans in the window whose NVML telemetry saw an XID, ECC errors or a
    failed remapping (:meth:`~..store.diagnostics.Hardware.events`), oldest first."""

    def after_release(self, device: str, t: float) -> bool:
        """Whether evidence of ``device`` at ``t`` counts: it is not older than the device's last release."""
        return t >= self.releases.get(device, float("-inf"))


@dataclass(frozen=True, kw_only=True)
class PolicyVerdict:
    """What one run decided: the one write that records it (:meth:`~..store.quarantine.Quarantine.record_policy_run`)
    and what the run says of it."""

    notes: tuple[Decision, ...] = ()
    """Fleet-wide findings, in order: the breakers' trips, then the devices newly slow."""
    quarantine: Mapping[str, str] = field(default_factory=dict)
    """``device -> why`` to quarantine (one already quarantined is left as it is)."""
    passed_probation: Mapping[str, str] = field(default_factory=dict)
    """``device -> why`` its probation ends."""
    breaker_tripped: bool = False
    """The scanner's circuit breaker tripped: the suite or the software is suspect."""
    training_breaker_jobs: tuple[str, ...] = ()
    """Jobs whose training incidents named too many devices (their incidents quarantine nobody)."""
    slowness: Mapping[str, Slowness] | None = None
    """(fleet) The slowness rule's verdicts of the window, kept for the reports over it (``--slow-max-age``)."""


def decide(inputs: PolicyInputs, policy: QuarantinePolicy) -> PolicyVerdict:
    """The policy's decisions from ``inputs`` under ``policy``: a pure function (see the module docstring)."""
    if inputs.scope == "node":
        return PolicyVerdict(quarantine=_node_candidates(inputs, policy))
    return _fleet_rules(inputs, policy)


def _node_candidates(inputs: PolicyInputs, policy: QuarantinePolicy) -> dict[str, str]:
    if not policy.quarantine_on_sticky:
        return {}
    scope = inputs.devices
    sticky = [
        f
        for f in inputs.failures
        if f.sticky and (scope is None or f.device in scope) and inputs.after_release(f.device, f.started_at)
    ]
    if not sticky:
        return {}
    shared: dict[tuple[str, str], set[str]] = {}
    for f in inputs.failures:
        if f.digest:
            shared.setdefault((f.case, f.digest), set()).add(f.device)
    found: dict[str, str] = {}
    for f in sticky:
        peers = sorted(inputs.passers.get(f.case, frozenset()) - {f.device})
        if (
            not peers
            or f.device in found
            or (f.digest or "") in inputs.pass_digests.get(f.case, frozenset())
            or len(shared.get((f.case, f.digest or ""), ())) > 1
        ):
            continue  # the fleet's view is needed (see sdcguard.fleet.policy's docstring)
        found[f.device] = (
            f"sticky failure: case {f.case} failed and the failure reproduced on retest, while {peers[0]} on the "
            "same node passed it (the golden data and the software there are sound)"
        )
    return found


def _fleet_rules(inputs: PolicyInputs, policy: QuarantinePolicy) -> PolicyVerdict:
    """The fleet's rules: quarantines (the breakers first), probations passed, and the notes."""
    verdict = judge_suite(inputs.failures, inputs.suite, policy, now=inputs.now)
    evidence = [
        f for f in inputs.failures if not verdict.is_suspect(f) and inputs.after_release(f.device, f.started_at)
    ]
    # an incident counts unless every device it names was released after it
    incidents = [i for i in inputs.incidents if _counts_after_releases(i, inputs)]
    training = judge_training(incidents, policy)
    notes = [Decision(device=None, decision="breaker", reason=why) for why in verdict.trips]
    notes += [Decision(device=None, decision="training_breaker", reason=why) for why in training.tripped_jobs.values()]
    slowness, slow_notes, slow = _slow_rule(inputs, policy)
    notes += slow_notes
    found: dict[str, str] = {}
    if not verdict.trips:
        states = {e.device: e.state for e in inputs.quarantine}
        found = {
            d: why
            for d, why in {**slow, **_fleet_candidates(inputs, policy, evidence, verdict, training.counts)}.items()
            if states.get(d) != "quarantined"
        }
    # Probation: any evidence failure since the release brings the device back into quarantine.
    probation = {
        e.device: e.since
        for e in inputs.quarantine
        if e.state == "probation" and (inputs.devices is None or e.device in inputs.devices)
    }
    if not verdict.trips:
        for f in evidence:
            if f.device in probation and f.started_at >= probation[f.device]:
                found[f.device] = f"failed case {f.case} while on probation after a manual release"
    passed = {
        dev: f"{n} clean complete scans since the release (policy needs {policy.probation_clean_scans})"
        for dev, n in sorted(inputs.clean_scans.items())
        if n >= policy.probation_clean_scans and dev not in found
    }
    return PolicyVerdict(
        notes=tuple(notes),
        quarantine=found,
        passed_probation=passed,
        breaker_tripped=bool(verdict.trips),
        training_breaker_jobs=tuple(sorted(training.tripped_jobs)),
        slowness=slowness,
    )


def _counts_after_releases(incident: Incident, inputs: PolicyInputs) -> bool:
    """An incident counts unless every device it names was released after it (one naming none counts)."""
    named = incident.devices or ((incident.device,) if incident.device else ())
    return not named or any(inputs.after_release(d, incident.time) for d in named)


def _fleet_candidates(
    inputs: PolicyInputs,
    policy: QuarantinePolicy,
    evidence: list[FailedExecution],
    verdict: SuiteVerdict,
    incident_counts: dict[str, int],
) -> dict[str, str]:
    since = inputs.now - policy.window_s
    scope = inputs.devices
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
    rated = sorted(d for d in k if d in inputs.executions)
    if rated:
        n = [inputs.executions[d] for d in rated]
        low, _ = clopper_pearson_arrays([k[d] for d in rated], n, policy.confidence)
        for device, executions, lo in zip(rated, n, low.tolist()):
            if lo > policy.rate_threshold:
                add(
                    device,
                    f"failure rate {k[device]}/{executions}: lower {policy.confidence:.0%} bound "
                    f"{lo:.3g} exceeds threshold {policy.rate_threshold:.3g}",
                )
    for dev, diag in sorted(inputs.diagnostics.items()):  # read only with dcgm_failures on
        if diag.time >= since and (scope is None or dev in scope) and inputs.after_release(dev, diag.time):
            add(dev, f"DCGM diagnostic failed: {', '.join(diag.failed)} (dcgm_failures is on)")
    for dev, why in _nvml_rule(inputs, since).items():  # read only with nvml_errors on
        add(dev, why)
    if policy.incident_threshold > 0:
        for dev, count in sorted(incident_counts.items()):
            if count >= policy.incident_threshold and (scope is None or dev in scope):
                add(dev, f"{count} training incidents named it alone in the last {policy.window_s / DAY_S:g} days")
    return found


def _nvml_rule(inputs: PolicyInputs, since: float) -> dict[str, str]:
    """Each GPU (of ``inputs.devices``) whose scans since ``since`` and its last release saw a hardware event
    (:func:`~..nvml.hardware_events`), named by the latest such scan."""
    scope = inputs.devices
    seen: dict[str, list[NvmlScan]] = {}
    for r in inputs.nvml:
        if r.time >= since and (scope is None or r.device in scope) and inputs.after_release(r.device, r.time):
            if hardware_events(r):
                seen.setdefault(r.device, []).append(r)
    found = {}
    for dev, scans in sorted(seen.items()):
        last = max(scans, key=lambda r: (r.time, r.scan))
        more = f"; {len(scans) - 1} earlier scan(s) in the window too" if len(scans) > 1 else ""
        found[dev] = (
            f"NVML: {', '.join(hardware_events(last))} during the scan started {iso_utc(last.time)}{more} "
            "(nvml_errors is on)"
        )
    return found


def _slow_rule(
    inputs: PolicyInputs, policy: QuarantinePolicy
) -> tuple[dict[str, Slowness] | None, list[Decision], dict[str, str]]:
    """``(the slowness verdicts to keep, a slow note for each device newly slow in the window, the devices to
    quarantine for it with slow_drain)``."""
    if inputs.slowness is None:
        return None, [], {}
    computed = judge_fleet(inputs.slowness, policy.slow_settings)
    wanted = inputs.devices if inputs.devices is not None else {d.id for d in inputs.slowness.known}
    verdicts = with_training(computed, inputs.incidents, wanted=wanted)
    notes: list[Decision] = []
    drain: dict[str, str] = {}
    window = inputs.now - policy.window_s
    for device, v in sorted(verdicts.items()):
        if not v.slow:
            continue
        why = f"slow ({v.basis}, {v.confidence} confidence): {v.reason}"
        if device not in inputs.slow_noted:
            notes.append(Decision(device=device, decision="slow", reason=why))
        # the slowness of a window that began before the device's release is partly older evidence: no drain
        if policy.slow_drain and inputs.after_release(device, window):
            drain[device] = why + "; slow_drain is on"
    return computed, notes, drain
