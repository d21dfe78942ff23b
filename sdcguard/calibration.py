"""Determinism preflight: are replays of a clean step bit-identical on each rank and across ranks?

Exact replay blames hardware for any difference, so it is only sound where healthy devices reproduce each other
bit for bit. :func:`calibrate` replays one clean micro-batch twice on each rank and once on a peer, compares the
digests, and when they differ names the usual causes (deterministic algorithms off, ``CUBLAS_WORKSPACE_CONFIG``,
order-dependent ops such as ``index_add_`` and ``scatter_add_``). The guard then reports later mismatches as
``nondeterministic`` instead of blaming a device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .capture import Batch, capture_rng, make_capture
from .shadows import exchange_objects, peer_source, peer_target

if TYPE_CHECKING:
    from .guard import SDCGuard

__all__ = ["CalibrationReport", "calibrate", "likely_causes"]

# Ops whose CUDA kernels accumulate with atomics (order-dependent float sums): the usual reason a replay differs.
NONDETERMINISTIC_OPS = (
    "index_add",
    "scatter_add",
    "scatter_reduce",
    "index_put",
    "put_",
    "embedding_dense_backward",
    "_embedding_bag_backward",
    "index_reduce",
    "bincount",
    "histc",
    "cumsum",
)


@dataclass(frozen=True, kw_only=True)
class CalibrationReport:
    """Result of ``guard.calibrate``: are replays bit-identical on this setup?"""

    deterministic: bool
    same_device: bool
    """A re-run on each rank's own device reproduced its result bit for bit (on every rank)."""
    cross_rank: bool
    """Another rank's replay reproduced each rank's result bit for bit."""
    causes: tuple[str, ...] = ()
    """Likely reasons when not deterministic."""
    ranks_differing: tuple[int, ...] = ()
    """Global ranks whose result was not reproduced."""

    def __str__(self) -> str:
        if self.deterministic:
            return "replays are bit-identical on each rank and across ranks"
        where = "across ranks" if self.same_device else "on the same device"
        causes = "; ".join(self.causes) or "unknown"
        return f"replays are NOT bit-identical ({where}); likely causes: {causes}"


class _OpRecorder(TorchDispatchMode):
    """Records which aten ops ran (calibration names order-dependent ones as likely causes)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def likely_causes(ops_seen: set[str], device: torch.device) -> list[str]:
    """Why replays may differ on this setup, most likely first (never empty)."""
    causes: list[str] = []
    ops = sorted(op for op in ops_seen if op.rstrip("_") in NONDETERMINISTIC_OPS or op in NONDETERMINISTIC_OPS)
    if not torch.are_deterministic_algorithms_enabled():
        causes.append("deterministic algorithms are off (torch.use_deterministic_algorithms(True))")
    if device.type == "cuda":
        if not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
            causes.append("CUBLAS_WORKSPACE_CONFIG is not set (use :4096:8)")
        if torch.backends.cudnn.benchmark:
            causes.append("torch.backends.cudnn.benchmark is on")
    if ops:
        causes.append("order-dependent ops ran: " + ", ".join(ops))
    if not causes:
        causes.append("the loss function draws randomness the guard does not capture (pass rng_hook=)")
    return causes


def calibrate(guard: SDCGuard, batch: Batch) -> CalibrationReport:
    """Replay one clean step on each rank and across ranks (collective over the guard's data-parallel group).

    Touches neither ``.grad`` nor the random streams. Sets ``guard.nondeterministic`` from the result.
    """
    cap = make_capture(step=-1, rank=guard.dp_rank, micro_batch=0, batch=batch, rng=capture_rng(guard.rng_hook))
    recorder = _OpRecorder()
    with recorder:
        first = guard._replay(cap, same_process=True)
    again = guard._replay(cap, same_process=True)
    W, me, members = guard.dp_size, guard.dp_rank, guard.members
    if W > 1:
        theirs = exchange_objects(cap, dst=members[peer_target(me, 0, W)], src=members[peer_source(me, 0, W)],
                                  group=guard.group)
        cross_mine = guard._replay(theirs, same_process=False)
    else:
        cross_mine = first
    gathered: list[Any] = guard._gather((first, cross_mine, first == again, sorted(recorder.seen)))
    same_device = all(g[2] for g in gathered)
    differing = [members[r] for r in range(W) if not gathered[r][2]]
    cross = True
    for r in range(W):
        p = peer_source(r, 0, W) if W > 1 else r
        if gathered[r][1] != gathered[p][0]:
            cross = False
            differing.append(members[p])
    deterministic = same_device and cross
    causes = [] if deterministic else likely_causes({op for g in gathered for op in g[3]}, guard.device)
    guard.nondeterministic = not deterministic
    return CalibrationReport(deterministic=deterministic, same_device=same_device, cross_rank=cross,
                             causes=tuple(causes), ranks_differing=tuple(sorted(set(differing))))
