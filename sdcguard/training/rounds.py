"""The sampled round's shape: what every way of replaying (peer, dedicated shadow) gives the guard.

A :class:`Round` adds a fixed number of int64 columns to the guard's one per-step all-gather and, from the gathered
table, returns what it settled as :class:`RoundResult`\\ s (the peer round: the current step; a dedicated shadow:
earlier steps whose verdicts arrived). :func:`conclude` turns the judgements of one round into its result, by one
rule for every kind of round (:mod:`.attribution`): hardware verdicts name devices, unresolved ones name every
device of the disagreement and treat the step as corrupt, and software nondeterminism names no device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..records import Incident
from .attribution import Attributor, Judgement
from .capture import Capture
from .observe import Observed
from .taps import Digest

__all__ = ["Round", "RoundResult", "ReplayFn", "conclude"]

ReplayFn = Callable[[Capture, bool], Digest]
"""``replay(capture, same_process) -> Digest`` on this rank."""


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
    """Some original could not be seen on its own (accumulation without reduction), so it was not judged."""


class Round(Protocol):
    """One way of replaying sampled micro-batches (peer: :class:`~.peer.PeerRound`; dedicated shadows:
    :class:`~.shadows.DedicatedRound`). Every method is called on every rank of the group in the same order."""

    def records(self, sample: int) -> bool:
        """Whether this rank's micro-batch is the one checked at this sample (its hooks then record it)."""

    def columns(self, step: int, sample: int, sampled: bool, observed: Observed | None) -> list[int]:
        """This rank's int64 values for the step's gather (``observed``: this rank's sampled computation, None
        where its micro-batch is not the one checked). The same count on every rank."""

    def finish(self, step: int, sample: int, sampled: bool, table: Sequence[Sequence[int]]) -> list[RoundResult]:
        """What this step's gathered columns (one row per rank, this round's columns only) settle."""

    def close(self) -> list[RoundResult]:
        """End of training: settle what is outstanding."""


def conclude(step: int, settled: Sequence[tuple[int, Judgement]], attr: Attributor, *, devices: int,
             shared_cause_at: int, result: RoundResult) -> RoundResult:
    """Fill ``result`` from the judgements of one round (``(owner's global rank, judgement)`` each).

    Any software verdict makes the whole round software (no device named: the setup does not replay). Owners whose
    originals were spoiled as one-offs on ``shared_cause_at`` or more devices at once point at a cause they share
    (a collective: every rank's original of an FSDP2 step reads the same all-gather), which no single device
    explains: those become one unresolved incident."""
    soft = [j for _, j in settled if j.verdict == "software"]
    if soft:
        result.software.append(f"step {step}: {soft[0].how}")
        return result
    hardware = [(o, j) for o, j in settled if j.verdict == "hardware"]
    unresolved = [(o, j) for o, j in settled if j.verdict == "unresolved"]
    one_offs = [(o, j) for o, j in hardware if j.original_corrupt and j.blamed.get(o) is False]
    if len(one_offs) >= shared_cause_at:
        hardware = [(o, j) for o, j in hardware if (o, j) not in one_offs]
        owners = tuple(sorted(o for o, _ in one_offs))
        j = Judgement(verdict="unresolved", suspects=owners, original_corrupt=True,
                      first_unit=one_offs[0][1].first_unit,
                      how=f"the originals of {len(owners)} ranks ({', '.join(map(str, owners))}) were each wrong once "
                          "and right on a rerun: a cause they share (a collective), not one device")
        unresolved.append((owners[0], j))
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
