"""What the guard concludes from a round of checks: the incidents to report, what they say about determinism, which
steps the checks vouch for, which verdicts escalate, and where to roll back to after a fault.

Escalation: a device named *sticky* (by replay, or by a matmul checksum that failed again on its recompute) corrupts
every step it computes, but only sampled or checked steps are vetoed, so a sticky verdict escalates at once; so does an
unresolved verdict that repeats (a second one naming a device an earlier one named). The guard then raises or exits on
every rank alike (``GuardConfig.escalate``).

Pure bookkeeping on values every rank holds alike (they came out of the gathers), so every rank concludes alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ...records import Incident
from .attribution import Attributor, Judgement
from .calibration import CalibrationReport, Determinism, likely_causes
from .verification import Verification

__all__ = ["Outcomes", "RoundResult", "conclude"]


@dataclass
class RoundResult:
    """What a sampled round found (identical on every rank)."""

    step: int | None = None
    """The step those computations belong to (a dedicated shadow's verdict names an earlier one)."""
    vetoable: bool = True
    """The step is the one being decided now (a dedicated shadow's verdict comes after it was applied)."""
    incidents: list[Incident] = field(default_factory=list)
    corrupt: bool = False
    """Some rank's original computation of the step was wrong, or nobody can tell: it must not be committed."""
    software: list[str] = field(default_factory=list)
    """Why the setup was found not to replay bit for bit (devices disagreeing with themselves)."""
    ops: set[str] = field(default_factory=set)
    """aten ops seen while settling (to name order-dependent ones)."""
    blamed: set[int] = field(default_factory=set)
    """Global ranks named by a hardware verdict."""
    sticky: set[int] = field(default_factory=set)
    """Of those, the ones that reproduced their wrong result."""
    suspects: set[int] = field(default_factory=set)
    """Global ranks named by an unresolved verdict."""
    clean: set[int] = field(default_factory=set)
    """Global ranks whose computation this round verified (their original agreed with its replay or the verdict)."""
    unjudged: bool = False
    """Some original could not be seen on its own on any basis (accumulated before it was handed over, and not
    seen as produced either), so it was not judged."""


def conclude(
    step: int,
    settled: Sequence[tuple[int, Judgement]],
    attr: Attributor,
    *,
    devices: int,
    shared_cause_at: int,
    result: RoundResult,
) -> RoundResult:
    """Fill ``result`` from the judgements of one round (``(owner's global rank, judgement)`` each).

    Any software verdict makes the whole round software (no device named: the setup does not replay). One-offs on
    ``shared_cause_at`` or more devices at once point at a cause they share, which no single device explains: the
    originals of several owners each wrong once and right on a rerun (every rank's original of an FSDP2 step reads
    the same all-gathers), or the replays of several replayers each wrong once while the originals stand (an FSDP2
    replay's all-gather corrupted: every replay reads it at once). Each kind becomes one unresolved incident naming
    those ranks, with the verdicts it replaces in its detail, and the step is treated as corrupt (what spoiled them
    all may have reached the step's own collectives too)."""
    soft = [j for _, j in settled if j.verdict == "software"]
    if soft:
        result.software.append(f"step {step}: {soft[0].how}")
        return result
    hardware = [(o, j) for o, j in settled if j.verdict == "hardware"]
    unresolved = [(o, j) for o, j in settled if j.verdict == "unresolved"]
    originals = [(o, j) for o, j in hardware if j.original_corrupt and j.blamed.get(o) is False]
    replays = [(o, j) for o, j in hardware if not j.original_corrupt and j.blamed and not any(j.blamed.values())]
    for kind, group, ranks in (
        ("originals", originals, lambda o, j: {o}),
        ("replays", replays, lambda o, j: set(j.blamed)),
    ):
        if len(group) < shared_cause_at:
            continue
        taken = {id(j) for _, j in group}
        hardware = [(o, j) for o, j in hardware if id(j) not in taken]
        unresolved.append(_shared_cause(kind, group, tuple(sorted(set().union(*(ranks(o, j) for o, j in group))))))
    for _, j in hardware:
        result.corrupt |= j.original_corrupt
        result.blamed |= set(j.blamed)
        result.sticky |= {r for r, s in j.blamed.items() if s}
    result.incidents += attr.replay_incidents(step, hardware)
    told: set[tuple[int, ...]] = set()
    for owner, j in unresolved:  # one incident per set of suspects (two devices spoil each other's replays)
        result.corrupt = True
        result.suspects |= set(j.suspects)
        if j.suspects not in told:
            told.add(j.suspects)
            result.incidents.append(attr.unresolved(step, owner, j, alone=len(j.suspects) >= devices))
    return result


def _shared_cause(kind: str, group: Sequence[tuple[int, Judgement]], ranks: tuple[int, ...]) -> tuple[int, Judgement]:
    """One unresolved judgement for one-offs on several devices at once (``kind``: whose computations were wrong)."""
    whose = "originals" if kind == "originals" else "replays"
    j = Judgement(
        verdict="unresolved",
        suspects=ranks,
        original_corrupt=True,
        first_unit=group[0][1].first_unit,
        how=f"the {whose} of {len(ranks)} ranks ({', '.join(map(str, ranks))}) were each wrong once and right on a "
        "rerun: a cause they share (a collective), not one device ("
        + "; ".join(f"rank {o}'s micro-batch: {g.how}" for o, g in group)
        + ")",
    )
    return ranks[0], j


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

    def regrouped(
        self, attributor: Attributor, members: list[int], leavers: Sequence[int], *, speaks: bool
    ) -> Outcomes:
        """These outcomes for the group a recovery re-formed: what was learnt about determinism and the unresolved
        suspects that stay is kept; what was verified starts again (the job rolled back)."""
        new = Outcomes(attributor, members, self.device, speaks=speaks)
        new.determinism, new.unresolved = self.determinism, self.unresolved - set(leavers)
        return new

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

    @property
    def replay_on(self) -> bool:
        """False once replays on this setup proved not bit-identical (replay checks are then off for the run)."""
        return self.determinism.state != "nondeterministic"

    def calibrated(self, report: CalibrationReport, j: Judgement | None, first: int, devices: int) -> list[Incident]:
        """What a ``calibrate()`` concludes (``j``: its judgement of the disagreement, ``first``: the rank whose
        micro-batch it computed, ``devices``: how many computed it): the setup replays, software does not, or a
        device was named (``calibration``) or nobody could be (``unresolved``)."""
        if report.verdict == "deterministic":
            self.determinism.state = "deterministic"
            return []
        if report.verdict == "software":
            self.determinism.declare(f"calibrate(): {report}", list(report.causes))
            return []
        if j is None:
            return []
        if report.verdict == "hardware":
            return self.attr.replay_incidents(-1, [(first, j)], kind="calibration")
        return [self.attr.unresolved(-1, first, j, alone=len(j.suspects) >= devices)]

    def calibrated_runs(
        self, runs: Sequence[tuple[CalibrationReport, Judgement | None, int]], devices: int
    ) -> tuple[CalibrationReport, list[Incident]]:
        """What the calibrations of every slice of a job conclude (``(report, judgement, first rank)`` each, one per
        slice, in any order and repeated by each of its ranks): the job's report (software if any slice's is) and
        the incidents, each slice's once, software last (it turns replay off for the run)."""
        order = ("deterministic", "hardware", "unresolved", "software")
        unique = sorted(
            {first: (r, j, first) for r, j, first in runs}.values(), key=lambda s: (order.index(s[0].verdict), s[2])
        )
        found = [i for r, j, first in unique for i in self.calibrated(r, j, first, devices)]
        return unique[-1][0] if unique[-1][0].verdict == "software" else runs[0][0], found

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run keeps of these conclusions."""
        return {
            "determinism": self.determinism.state_dict(),
            "verification": self.verification.state_dict(),
            "unresolved": sorted(self.unresolved),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take what a resumed run kept; a version-1 guard state kept only whether replays proved nondeterministic."""
        determinism = state.get("determinism", {})
        if "nondeterministic" in state:
            determinism = {"state": "nondeterministic" if state["nondeterministic"] else "unknown"}
        self.determinism.load_state_dict(determinism)
        self.verification.load_state_dict(state.get("verification", {}))
        self.unresolved = {int(r) for r in state.get("unresolved", ())}

    def escalating(self, found: list[Incident]) -> list[Incident]:
        """The incidents among ``found`` that escalate: a device named sticky, or an unresolved verdict naming a
        rank an earlier unresolved verdict named (the first one is remembered here)."""
        out = [i for i in found if i.kind in ("replay", "calibration", "checksum", "memory") and i.sticky]
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
        elif incident.kind in ("gradient_replica", "memory", "reduction"):  # checked on every step before it
            earliest = incident.step
        else:
            return incident
        if not (incident.kind in ("gradient_replica", "reduction") and vetoed):
            v.taint(earliest)
        note = v.rollback(earliest)
        last = v.last_verified_step  # below the taint: a state from before the fault
        verified = None if last is None or last + 1 > earliest else last + 1
        return replace(
            incident,
            rollback=note.checkpoint_id if note else None,
            first_step=min(earliest, incident.step),
            rollback_step=verified,
        )
