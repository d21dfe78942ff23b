"""The sampled round's shape: what every way of replaying (peer, dedicated shadow) gives the guard.

A :class:`Round` adds a fixed number of int64 columns to the guard's one per-step all-gather and, from the gathered
table, returns what it settled as :class:`~sdcguard.training.verdicts.outcomes.RoundResult`\\ s (the peer round:
the current step; a dedicated shadow: earlier steps whose verdicts arrived), concluded by one rule for every kind
of round (:func:`~sdcguard.training.verdicts.outcomes.conclude`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from ...records import Incident
from ..digest import Digest
from ..replay.capture import Capture
from ..replay.observe import Observed
from ..verdicts.outcomes import RoundResult

__all__ = ["Round", "ReplayFn"]

ReplayFn = Callable[[Capture, bool], Digest]
"""``replay(capture, same_process) -> Digest`` on this rank."""


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

    def escalate(
        self, action: Literal["raise", "exit"], incidents: Sequence[Incident], status: Callable[[int], int]
    ) -> None:
        """Every rank raises or exits at this step: tell the ranks that do not take part in the step (dedicated
        shadows) to do the same; ``status(rank)``: such a rank's exit status."""

    def close(self) -> list[RoundResult]:
        """End of training: settle what is outstanding."""
