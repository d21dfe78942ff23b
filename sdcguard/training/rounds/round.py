"""The sampled round's shape: what every way of replaying (peer, dedicated shadow) gives the guard.

A :class:`Round` adds a fixed number of int64 columns to the guard's one per-step all-gather and, from the gathered
table, returns what it settled as :class:`~sdcguard.training.verdicts.outcomes.RoundResult`\\ s (the peer round:
the current step; a dedicated shadow: earlier steps whose verdicts arrived), concluded by one rule for every kind
of round (:func:`~sdcguard.training.verdicts.outcomes.conclude`). :class:`RoundCheck` makes any round one of the
guard's step checks (:mod:`sdcguard.training.step_check`): the round's columns are its slice, and the results it
settles become incidents through :class:`~sdcguard.training.verdicts.outcomes.Outcomes`, vetoing the step when the
step's own computation was corrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch

from ...records import Incident
from ..replay.observe import Observed
from ..step_check import CheckResult, StepState
from ..verdicts.outcomes import Outcomes, RoundResult

__all__ = ["Round", "RoundCheck"]


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

    def reform(self, plan: Any, incidents: Sequence[Incident]) -> None:
        """The job recovers by ``plan`` (:mod:`sdcguard.training.recovery`): tell the ranks that do not take part in
        the step (dedicated shadows), after what is in flight to them has arrived."""

    def close(self) -> list[RoundResult]:
        """End of training: settle what is outstanding."""


class RoundCheck:
    """A :class:`Round` as a step check (slice ``"round"``): see the module docstring."""

    name = "round"

    def __init__(
        self,
        round: Round,
        outcomes: Outcomes,
        device: torch.device,
        log: logging.LoggerAdapter[logging.Logger],
        *,
        speaks: bool,
    ) -> None:
        self.round = round
        self.outcomes = outcomes
        self.device = device
        self.log = log
        self.speaks = speaks
        """Whether this rank says the one-time warnings (one rank per group does)."""
        self._warned_unjudged = False

    def columns(self, state: StepState) -> torch.Tensor:
        values = self.round.columns(state.step, state.sample, state.sampled, state.observed)
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        results = self.round.finish(state.step, state.sample, state.sampled, rows)
        if any(r.unjudged for r in results):
            self._warn_unjudged()
        found = [i for r in results for i in self.outcomes.settled(r)]
        veto = any(r.corrupt and r.vetoable and r.step == state.step for r in results)  # settled() cleared software
        return CheckResult(incidents=tuple(found), veto=veto, ran="replay" if state.sampled else None)

    def close(self) -> list[Incident]:
        """End of training: what the round still had outstanding (a dedicated shadow's verdicts)."""
        return [i for r in self.round.close() for i in self.outcomes.settled(r)]

    def _warn_unjudged(self) -> None:
        if not self._warned_unjudged and self.speaks:
            self._warned_unjudged = True
            self.log.warning(
                "a sampled micro-batch's local gradients were not seen on their own: the step accumulated "
                "micro-batches before handing them over (FSDP2 set_requires_gradient_sync(False), or a shard group "
                "of one rank), and the gradients as autograd produced them could not be read either (this torch "
                "keeps FSDP2's unsharded parameters where the guard does not look, or the parameters were not "
                "gathered before the sampled backward); such samples are not judged"
            )
