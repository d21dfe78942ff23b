"""Which training steps the guard's checks vouch for, and where to roll back to after an incident.

A sample that passes vouches for a rank's computation at that step: a faulty unit (sticky or intermittent) would
have shown. Between two samples of a rank nothing does: a fault found at a later sample may have entered the
weights right after the rank's previous clean sample. So:

- ``clean[r]``: the step of rank ``r``'s latest sample that passed;
- an incident that could not be vetoed (a dedicated shadow's verdict comes after the step was applied;
  ``on_detect="record"``; diverged weights) *taints* the run from the step after the faulty rank's previous clean
  sample (or the last clean weight comparison): those steps may hold the corruption;
- ``last_verified_step``: the latest step that every rank's latest clean sample is at or after, below any taint.
  None until every rank has been sampled cleanly once (or when replay is off: then nothing vouches for the
  computation).

A checkpoint of the state after step ``s`` is *verified* when ``s <= last_verified_step``. After an incident, the
place to restart from is the newest verified checkpoint at or before the earliest step the fault could have
touched (:meth:`Verification.earliest_touched`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Verification", "CheckpointNote"]


@dataclass(frozen=True)
class CheckpointNote:
    """A checkpoint the guard was told about (``sdcguard.checkpoint.save(..., guard=guard)``)."""

    checkpoint_id: str
    step: int
    verified: bool


class Verification:
    """The bookkeeping behind ``guard.last_verified_step`` (see the module docstring); identical on every rank."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        self.clean: dict[int, int] = {}
        """Global rank -> step of its latest clean sample."""
        self._history: dict[int, list[int]] = {r: [] for r in self.ranks}
        self.tainted_from: int | None = None
        """The earliest step whose state may hold an undetected corruption (None: none known)."""
        self.weights_clean: int | None = None
        """The latest step at which the weights were compared and agreed."""
        self.checkpoints: list[CheckpointNote] = []

    def sampled(self, step: int, clean_ranks: Iterable[int]) -> None:
        """The computations of ``clean_ranks`` at ``step`` passed their replay."""
        for r in clean_ranks:
            self.clean[r] = step
            self._history.setdefault(r, []).append(step)

    def earliest_touched(self, rank: int | None, step: int) -> int:
        """The earliest step a fault found at ``step`` on ``rank`` could have touched: the step after that rank's
        latest clean sample before ``step`` (0 when it never had one; every rank's when the rank is unknown)."""
        ranks = [rank] if rank is not None else self.ranks
        earliest = step
        for r in ranks:
            before = [s for s in self._history.get(r, []) if s < step]
            earliest = min(earliest, before[-1] + 1 if before else 0)
        return earliest

    def taint(self, first_step: int) -> None:
        """The state from ``first_step`` on may hold a corruption that no veto stopped."""
        self.tainted_from = first_step if self.tainted_from is None else min(self.tainted_from, first_step)

    def weights_compared(self, step: int, agreed: bool) -> None:
        if agreed:
            self.weights_clean = step
        else:  # the replicas diverged at some step after the last comparison that agreed
            self.taint(0 if self.weights_clean is None else self.weights_clean + 1)

    @property
    def last_verified_step(self) -> int | None:
        if not self.ranks or any(r not in self.clean for r in self.ranks):
            return None
        last = min(self.clean[r] for r in self.ranks)
        if self.tainted_from is not None:
            if self.tainted_from <= last:
                verified = [s for s in self._common() if s < self.tainted_from]
                return verified[-1] if verified else None
        return last

    def _common(self) -> list[int]:
        # Steps at which every rank's latest clean sample was at or after them: any step up to the minimum; the
        # candidates worth naming are the sampled steps themselves.
        steps = sorted({s for h in self._history.values() for s in h})
        return [s for s in steps if all(any(t >= s for t in self._history.get(r, [])) for r in self.ranks)]

    def note_checkpoint(self, checkpoint_id: str, step: int) -> CheckpointNote:
        """Remember a checkpoint of the state after ``step``; whether it is verified now."""
        last = self.last_verified_step
        note = CheckpointNote(checkpoint_id=checkpoint_id, step=step, verified=last is not None and step <= last)
        self.checkpoints.append(note)
        return note

    def rollback(self, earliest: int) -> CheckpointNote | None:
        """The newest verified checkpoint of a state before ``earliest`` (the state after step ``earliest - 1``)."""
        good = [c for c in self.checkpoints if c.verified and c.step < earliest]
        return max(good, key=lambda c: c.step) if good else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": {str(r): h[-64:] for r, h in self._history.items()},
            "tainted_from": self.tainted_from,
            "weights_clean": self.weights_clean,
            "checkpoints": [[c.checkpoint_id, c.step, c.verified] for c in self.checkpoints[-64:]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history = {int(r): list(h) for r, h in state.get("history", {}).items()}
        for r in self.ranks:
            self._history.setdefault(r, [])
        self.clean = {r: h[-1] for r, h in self._history.items() if h}
        self.tainted_from = state.get("tainted_from")
        self.weights_clean = state.get("weights_clean")
        self.checkpoints = [CheckpointNote(c[0], int(c[1]), bool(c[2])) for c in state.get("checkpoints", [])]
