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
  2. The circuit breakers (:mod:`..breaker`): failures the suite or the software is blamed for are never
     evidence, and while such failures are inside ``breaker_window_s`` nobody is quarantined in that run (the
     outcome says why). Training incidents of a job that named too many devices are never evidence either.
  3. A device is quarantined on a sticky failure, on ``rate_low`` above ``rate_threshold`` at ``confidence``,
     or on ``incident_threshold`` attributed training incidents naming it in the window; where told, also on the
     hardware's own opinion in the window: a failed DCGM diagnostic (``dcgm_failures``), a hardware event in
     NVML's telemetry of its scans (``nvml_errors``: :mod:`..nvml`).
  4. Probation (after a manual release): any failure since the release re-quarantines the device;
     ``probation_clean_scans`` complete clean scans end it.

A release by hand is a boundary of evidence, in both scopes: failures, training incidents (to the training breaker
too) and a device's rate from before its last release never quarantine it again (a device released inside the
window is rated on its executions since), nor make it ``suspect`` in a report; a device released inside the
window is not drained for slowness (the window's timings predate it) until a window has passed. A hold
(``quarantine add``) is lifted only by a release: probation, which a run may end, follows a release alone.

A run (:func:`~.run.apply_policy`) reaps, then reads everything the rules weigh at once (:func:`~.run.read_inputs`:
one frozen :class:`~.rules.PolicyInputs`), decides (:func:`~.rules.decide`: a pure function of those inputs and the
settings, like the training side's verdicts), and records every decision with its reason (``policy_decisions``, and
each quarantine in ``quarantine_history``) in one transaction; then the action templates run for quarantined
devices whose actions have not succeeded yet. :mod:`.settings` holds :class:`~.settings.QuarantinePolicy`.
"""

from .rules import PolicyInputs, PolicyVerdict, decide
from .run import PolicyOutcome, apply_policy, read_inputs
from .settings import PolicyScope, QuarantinePolicy

__all__ = [
    "QuarantinePolicy",
    "PolicyScope",
    "PolicyInputs",
    "PolicyVerdict",
    "PolicyOutcome",
    "read_inputs",
    "decide",
    "apply_policy",
]
