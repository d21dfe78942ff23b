"""Which state the replicas agree on: a pure rule over values every rank gathered alike.

A state is named by ``(step, digest)`` (:class:`~.snapshot.Snapshot`: the step it starts, the digest of every
tensor and plain value in it). :func:`confirmed` is the one rule of every vote a recovery takes: before a heal
(which snapshot is the verified source), after it (does every replica hold that state: :func:`holders`), and when a
restarted job looks for a snapshot that survived (the newest one a strict majority of the job holds).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["State", "confirmed", "holders"]

State = tuple[int, int]
"""``(step, digest)`` of a snapshot."""


def confirmed(values: Sequence[State | None], *, voters: int) -> State | None:
    """The newest state held by a strict majority of ``voters`` (ranks without a state, ``None``, count as voters
    who hold none of them); None when no state is."""
    counts = Counter(v for v in values if v is not None)
    held = [state for state, n in counts.items() if 2 * n > voters]
    return max(held, default=None)


def holders(values: Sequence[State | None], state: State) -> list[int]:
    """The positions that hold ``state``."""
    return [i for i, v in enumerate(values) if v == state]
