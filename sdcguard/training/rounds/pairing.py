"""Who replays whom: the peer pairing of sampled steps and the assignment of samples to dedicated shadows.

Peer mode: at the ``sample``-th sampled step, rank ``r`` replays the micro-batch of rank ``(r - o) mod W`` with an
offset ``o`` cycling through ``1 .. W-1``, so over ``W - 1`` samples every rank has checked every other, and the
pairing is a ring (each rank sends one capture and receives one: no deadlock). Dedicated shadows: samples rotate
over the workers and over the shadows.
"""

from __future__ import annotations

__all__ = ["peer_offset", "peer_source", "peer_target", "shadow_assignment"]


def peer_offset(sample: int, world: int) -> int:
    """Offset of the peer pairing for the ``sample``-th sampled step: cycles through ``1 .. W-1``."""
    if world < 2:
        return 0
    return 1 + sample % (world - 1)


def peer_source(rank: int, sample: int, world: int) -> int:
    """The rank whose micro-batch ``rank`` replays at that sample."""
    return (rank - peer_offset(sample, world)) % world


def peer_target(rank: int, sample: int, world: int) -> int:
    """The rank that replays ``rank``'s micro-batch at that sample."""
    return (rank + peer_offset(sample, world)) % world


def shadow_assignment(sample: int, num_workers: int, num_shadows: int) -> tuple[int, int]:
    """``(worker index, shadow index)`` of a sample: samples rotate over workers and over shadows."""
    return sample % num_workers, sample % num_shadows
