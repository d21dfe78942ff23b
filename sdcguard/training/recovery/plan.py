"""The one job-wide decision of a recovery, as a pure function of values every rank holds alike (the escalating
incidents came out of the step's gather, the roles out of the guard's construction): who leaves, which spare takes
a leaver's place, who goes on, or that the job must exit.

Rules, in order:

1. The *leavers* are the suspects of the escalating incidents that are ranks of the job (workers or dedicated
   shadows): nobody else ever leaves. An ``unresolved`` verdict names two or more devices and cannot say which is
   faulty: its suspects are *undecided*, and when one of them is not also named by a verdict that settles it, the
   job cannot go on without risking a healthy device's leaving: every rank exits by the contract with 85 (86 only
   on the named leavers), the incident in the store naming every suspect.
2. A replica that spans several ranks (an HSDP replica: one rank per shard) leaves whole: a replica missing a shard
   cannot go on. Its other ranks are *released*: their devices are not suspects, they leave with 85.
3. Each worker that leaves is replaced by a dedicated shadow that does not leave, lowest rank first (a *spare*);
   only where every replica is one rank (dedicated shadows replay a whole model on one device).
4. The new data-parallel group is the workers that stay plus the promoted spares, in rank order: the order its
   reductions sum in, so the data-parallel ranks are numbered by it (a fault-free run of the same size sums the
   same data ranks in the same order).
5. The job goes on (``reform``) when it keeps as many replicas as before, or at least ``min_replicas`` of them
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
    """The suspects that leave (86)."""
    members: tuple[int, ...]
    """The new data-parallel group, in data-rank order (empty when the job exits)."""
    promoted: tuple[int, ...]
    """Spares that become workers."""
    shadows: tuple[int, ...]
    """Dedicated shadows that stay shadows."""
    action: Literal["reform", "exit"]
    released: tuple[int, ...] = ()
    """Healthy ranks of a replica that leaves whole (85)."""

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
    replicas: Sequence[Sequence[int]] = (),
) -> RecoveryPlan:
    """The plan for suspects named at ``step`` (``undecided``: suspects of unresolved verdicts; ``spares``: the
    shadows may be promoted; ``replicas``: the workers grouped by replica, each group leaving whole; empty: every
    worker is a replica of its own)."""
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
    groups = [tuple(g) for g in replicas] or [(w,) for w in workers]
    leaving = [g for g in groups if set(g) & set(leavers)]
    released = tuple(sorted(r for g in leaving for r in g if r not in leavers))
    staying_shadows = [s for s in sorted(shadows) if s not in leavers]
    singles = all(len(g) == 1 for g in groups)
    promoted = tuple(staying_shadows[: len(leaving)]) if spares and singles else ()
    gone = set(leavers) | set(released)
    members = tuple(sorted([w for w in workers if w not in gone] + list(promoted)))
    left_shadows = tuple(s for s in staying_shadows if s not in promoted)
    kept = len(groups) - len(leaving) + len(promoted)
    enough = kept == len(groups) or (min_replicas is not None and kept >= min_replicas)
    action: Literal["reform", "exit"] = "reform" if members and enough else "exit"
    return RecoveryPlan(
        step=step,
        workers=tuple(workers),
        leavers=leavers,
        members=members if action == "reform" else (),
        promoted=promoted if action == "reform" else (),
        shadows=left_shadows,
        action=action,
        released=released,
    )
