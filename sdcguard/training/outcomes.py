"""What the guard concludes from a round of checks: the incidents to report, what they say about determinism, which
steps the checks vouch for, which verdicts escalate, and where to roll back to after a fault.

Escalation: a device named *sticky* (by replay, or by a matmul checksum that failed again on its recompute) corrupts
every step it computes, but only sampled or checked steps are vetoed, so a sticky verdict escalates at once; so does an
unresolved verdict that repeats (a second one naming a device an earlier one named). The guard then raises or exits on
every rank alike (``GuardConfig.escalate``).

Pure bookkeeping on values every rank holds alike (they came out of the gathers), so every rank concludes alike.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..records import Incident
from .attribution import Attributor
from .calibration import Determinism, likely_causes
from .rounds import RoundResult
from .verification import Verification

__all__ = ["Outcomes"]


class Outcomes:
    """Determinism, verification, escalation and roll-back bookkeeping of one guard (see the module docstring)."""

    def __init__(self, attributor: Attributor, members: list[int], device: torch.device, *, speaks: bool) -> None:
        self.attr = attributor
        self.determinism = Determinism()
        self.verification = Verification(members)
        self.device = device
        self.speaks = speaks
        """Whether this rank says it aloud (the warning), once per group."""
        self.unresolved: set[int] = set()
        """Ranks an unresolved verdict named so far (a repeat escalates; kept in the guard's ``state_dict``)."""

    def settled(self, result: RoundResult) -> list[Incident]:
        """A round's incidents, or one ``nondeterministic`` incident when it shows software at work (never vetoed
        for: ``result.corrupt`` is cleared); the ranks it verified are noted."""
        if not result.software:
            if result.step is not None:
                self.verification.sampled(result.step, result.clean)
                if not result.incidents and not result.unjudged:
                    self.determinism.agreed()
            return result.incidents
        result.corrupt = False
        reason = "; ".join(result.software)
        if not self.determinism.declare(reason, likely_causes(result.ops, self.device)):
            return []
        if self.speaks:
            self.determinism.warn()
        return [self.attr.nondeterministic(result.step or 0, reason, self.determinism.causes)]

    def escalating(self, found: list[Incident]) -> list[Incident]:
        """The incidents among ``found`` that escalate: a device named sticky, or an unresolved verdict naming a
        rank an earlier unresolved verdict named (the first one is remembered here)."""
        out = [i for i in found if i.kind in ("replay", "calibration", "checksum") and i.sticky]
        for i in found:
            if i.kind == "unresolved":
                if self.unresolved & set(i.suspect_ranks):
                    out.append(i)
                self.unresolved |= set(i.suspect_ranks)
        return out

    def rollback(self, incident: Incident, *, vetoed: bool) -> Incident:
        """Taint the steps the fault could have touched and name the checkpoint to restart from."""
        v = self.verification
        if incident.kind in ("replay", "unresolved"):  # the rank may have been faulty since its last clean sample
            earliest = min(v.earliest_touched(r, incident.step) for r in incident.suspect_ranks)
        elif incident.kind == "weight_replica":
            earliest = 0 if v.weights_clean is None else v.weights_clean + 1
        elif incident.kind == "gradient_replica":  # every earlier step's gradients agreed across replicas
            earliest = incident.step
        else:
            return incident
        if not (incident.kind == "gradient_replica" and vetoed):
            v.taint(earliest)
        note = v.rollback(earliest)
        return replace(incident, rollback=note.checkpoint_id if note else None)
