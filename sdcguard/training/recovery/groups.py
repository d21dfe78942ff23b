"""What torchft's replica groups decide at each step, as a pure function of the votes every group gathered alike
(:func:`judge_groups`): whether any group may commit, which state the groups agree on, which group leaves, and whose
heal is refused.

A group's vote (:class:`GroupVote`) says what its guard found in the step (a corruption: the step is vetoed; a
device it named *sticky*: the group must leave), the state the step started from and the averaged gradients it
holds (their digests), and whether that state arrived by a heal at this step's quorum.

Rules, in order:

1. The *witnesses* are the groups that voted, did not heal at this step and are at the newest step of the votes: a
   healed group holds what its source sent, so it is no independent witness of the state, and a group behind is
   catching up (a heal torchft asked for did not arrive; its next quorum asks again). The *confirmed* state is the
   newest ``(step, digest)`` held by a strict majority of the witnesses (:func:`~.vote.confirmed`), the rule of
   every vote of a recovery.
2. The *leavers* are the groups whose guard named their own device sticky, and the witnesses that hold another
   state than the confirmed one (their state changed outside a committed step: memory, or a bad optimizer step).
   With no confirmed state the witnesses cannot be told apart: nobody leaves by this rule, and when witnesses
   disagree the verdict is ``unresolved`` (every group exits by the contract, as an unresolved recovery does).
3. The *refused* are the healed groups that do not hold the confirmed state, and the groups behind: they never
   commit what they hold and heal again (a bad heal's source, a witness holding the same wrong state, leaves by
   rule 2).
4. A group commits only when every group voted, no guard vetoed or named its device, a state is confirmed, every
   group holds it, and the averaged gradients are the same on every group; else no group commits (a corruption
   vetoes the step for every replica group), and the step is computed again without the leavers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .vote import State, confirmed

__all__ = ["GroupVote", "GroupsVerdict", "judge_groups", "VOTE_WIDTH"]

VOTE_WIDTH = 7
"""How many int64 values one vote takes in the gathered table."""


@dataclass(frozen=True, kw_only=True)
class GroupVote:
    """One replica group's vote at a step (see the module docstring)."""

    voted: bool = True
    """False for a row that never arrived (the all-reduce that gathers the votes failed on that group)."""
    corrupt: bool
    """The group's guard found a corruption in this step (it did not let the step commit)."""
    named: bool
    """The group's guard named its own device sticky: it must leave."""
    healed: bool
    """The group's state arrived by a heal at this step's quorum."""
    step: int
    """The step the state is at (torchft's ``manager.current_step()``)."""
    digest: int
    """The digest of the state the step started from (parameters, buffers, optimizer state), signed 64-bit."""
    gradients: int
    """The digest of the averaged gradients, signed 64-bit."""

    def row(self) -> list[int]:
        """The vote as :data:`VOTE_WIDTH` int64 values (a row that never arrived is all zeros)."""
        flags = [int(self.voted), int(self.corrupt), int(self.named), int(self.healed)]
        return [*flags, self.step, self.digest, self.gradients]

    @classmethod
    def from_row(cls, row: Sequence[int]) -> GroupVote:
        voted, corrupt, named, healed, step, digest, gradients = (int(v) for v in row)
        return cls(
            voted=bool(voted),
            corrupt=bool(corrupt),
            named=bool(named),
            healed=bool(healed),
            step=step,
            digest=digest,
            gradients=gradients,
        )


@dataclass(frozen=True, kw_only=True)
class GroupsVerdict:
    """What every group does after the votes of a step (see the module docstring); positions are replica ranks."""

    commit: bool
    state: State | None
    """The confirmed state (None: no strict majority of the witnesses holds one)."""
    leavers: tuple[int, ...]
    refused: tuple[int, ...]
    unresolved: bool
    """The witnesses disagree and no majority settles it: every group exits by the contract."""
    why: str
    """One line: why no group commits ("" when they do)."""


def judge_groups(votes: Sequence[GroupVote]) -> GroupsVerdict:
    """The verdict of a step from every group's vote, in replica-rank order (the module docstring's rules)."""
    newest = max((v.step for v in votes if v.voted), default=0)
    witnesses = [i for i, v in enumerate(votes) if v.voted and not v.healed and v.step == newest]
    state = confirmed([(votes[i].step, votes[i].digest) for i in witnesses], voters=len(witnesses))
    named = {i for i, v in enumerate(votes) if v.voted and v.named}
    strays = set() if state is None else {i for i in witnesses if (votes[i].step, votes[i].digest) != state}
    healed_or_behind = [i for i, v in enumerate(votes) if v.voted and (v.healed or v.step < newest)]
    refused = tuple(i for i in healed_or_behind if state is None or (votes[i].step, votes[i].digest) != state)
    unresolved = state is None and len({(votes[i].step, votes[i].digest) for i in witnesses}) > 1
    why = _why(votes, state, bool(strays or refused), bool(named))
    return GroupsVerdict(
        commit=not why,
        state=state,
        leavers=tuple(sorted(named | strays)),
        refused=refused,
        unresolved=unresolved,
        why=why,
    )


def _why(votes: Sequence[GroupVote], state: State | None, stray: bool, named: bool) -> str:
    """Why no group commits (rule 4), or ""."""
    if not all(v.voted for v in votes):
        return "a group's vote did not arrive"
    if any(v.corrupt for v in votes):
        return "a guard found a corruption"
    if named:
        return "a guard named its own device sticky"
    if state is None:
        return "no state a strict majority of the groups holds"
    if stray:
        return "a group holds another state than the others"
    if len({v.gradients for v in votes}) > 1:
        return "the groups' averaged gradients differ"
    return ""
