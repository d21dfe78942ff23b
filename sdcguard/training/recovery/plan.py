"""The one job-wide decision of a recovery, as a pure function of values every rank holds alike (the escalating
incidents came out of the step's gather, the roles out of the guard's construction): who leaves, which spare takes
a leaver's place, who goes on, or that the job must exit.

Rules, in order:

1. The *leavers* are the suspects of the escalating incidents that are ranks of the job (workers or dedicated
   shadows): nobody else ever leaves. An ``unresolved`` verdict names two or more devices and cannot say which is
   faulty: its suspects are *undecided*, and when one of them is not also named by a verdict that settles it, the
   job cannot go on without risking a healthy device's leaving: every rank exits by the contract with 85 (86 only
   on the named leavers), the incident in the store naming every suspect.
2. Each worker that leaves is replaced by a dedicated shadow that does not leave, lowest rank first (a *spare*).
3. The new data-parallel group is the workers that stay plus the promoted spares, in rank order: the order its
   reductions sum in, so the data-parallel ranks are numbered by it (a fault-free run of the same size sums the
   same data ranks in the same order).
4. The job goes on (``reform``) when it keeps as many workers as before, or at least ``min_replicas`` of them
   (and at least one); else every rank exits by the exit-code contract (``exit``): 86 on a leaver, 85 elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ...contract import EXIT_RESTART, EXIT_SUSPECT_DEVICE

__all__ = ["RecoveryPlan", "plan_recovery"]


@dataclass(frozen=True, kw_only=True)
class RecoveryPlan:
    """What every rank does (see the module docstring)."""

    step: int
    """The step of the verdict."""
    workers: tuple[int, ...]
    """The data-parallel workers before, in data-rank order."""
    leavers: tuple[int, ...]
    members: tuple[int, ...]
    """The new data-parallel group, in data-rank order (empty when the job exits)."""
    promoted: tuple[int, ...]
    """Spares that become workers."""
    shadows: tuple[int, ...]
    """Dedicated shadows that stay shadows."""
    action: Literal["reform", "exit"]

    def status(self, rank: int) -> int:
        """A rank's exit status under the contract."""
        return EXIT_SUSPECT_DEVICE if rank in self.leavers else EXIT_RESTART

    def data_rank(self, rank: int) -> int | None:
        """The data-parallel index ``rank`` feeds after the recovery (None: it is not a worker)."""
        return self.members.index(rank) if rank in self.members else None


def plan_recovery(
    step: int,
    workers: Sequence[int],
    shadows: Sequence[int],
    suspects: Iterable[int],
    *,
    min_replicas: int | None,
    spares: bool = True,
    undecided: Iterable[int] = (),
) -> RecoveryPlan:
    """The plan for suspects named at ``step`` (``undecided``: suspects of unresolved verdicts; ``spares``: the
    shadows may be promoted)."""
    job = set(workers) | set(shadows)
    leavers = tuple(sorted(set(suspects) & job))
    if (set(undecided) & job) - set(leavers):
        return RecoveryPlan(
            step=step,
            workers=tuple(workers),
            leavers=leavers,
            members=(),
            promoted=(),
            shadows=tuple(shadows),
            action="exit",
        )
    staying_shadows = [s for s in sorted(shadows) if s not in leavers]
    leaving_workers = [w for w in workers if w in leavers]
    promoted = tuple(staying_shadows[: len(leaving_workers)]) if spares else ()
    members = tuple(sorted([w for w in workers if w not in leavers] + list(promoted)))
    left_shadows = tuple(s for s in staying_shadows if s not in promoted)
    enough = len(members) == len(workers) or (min_replicas is not None and len(members) >= min_replicas)
    action: Literal["reform", "exit"] = "reform" if members and enough else "exit"
    return RecoveryPlan(
        step=step,
        workers=tuple(workers),
        leavers=leavers,
        members=members if action == "reform" else (),
        promoted=promoted if action == "reform" else (),
        shadows=left_shadows,
        action=action,
    )
