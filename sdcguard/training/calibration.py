"""Is this setup bit-reproducible? Exact replay blames hardware for any difference, so it is only sound where healthy
devices reproduce each other bit for bit.

The guard finds out by itself (:class:`Determinism`): the first sampled round whose replays all agree makes the run
``deterministic``; a disagreement that no majority settles (no two computations agree), or blame that moves from
device to device, makes it ``nondeterministic``. Then the guard says so once, loudly, with the likely causes
(:func:`likely_causes`), names no device, vetoes nothing for it, and turns replay off for the run while the
cross-replica checks (exact after the all-reduce whatever the kernels do) stay on.

:func:`calibrate` is the explicit preflight (``guard.calibrate(batch)``): each rank reruns one clean micro-batch
twice on its own device and once another rank's, and reports whether all agree, with the causes when not.
"""

from __future__ import annotations

import collections
import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .capture import Capture
from .comm import Comm
from .pairing import peer_source, peer_target
from .taps import Digest

__all__ = ["CalibrationReport", "Determinism", "OpRecorder", "calibrate", "likely_causes", "setup_warnings"]

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
_GENERATOR = "<generator>"


@dataclass(frozen=True, kw_only=True)
class CalibrationReport:
    """Result of ``guard.calibrate``: are replays bit-identical on this setup?"""

    deterministic: bool
    same_device: bool
    """A rerun on each rank's own device reproduced its result bit for bit (on every rank)."""
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


class OpRecorder(TorchDispatchMode):
    """Records which aten ops ran, and whether a random op drew from an explicit ``torch.Generator``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        self.seen.add(func.__name__.split(".")[0])
        if kwargs.get("generator") is not None:
            self.seen.add(_GENERATOR)
        return func(*args, **kwargs)


def likely_causes(ops_seen: set[str], device: torch.device) -> list[str]:
    """Why replays may differ on this setup, most likely first (never empty)."""
    causes: list[str] = []
    ops = sorted(op for op in ops_seen if op.rstrip("_") in NONDETERMINISTIC_OPS or op in NONDETERMINISTIC_OPS)
    if _GENERATOR in ops_seen:
        causes.append("random numbers were drawn from a torch.Generator of the model's own, which the guard does "
                      "not capture (capture its state with SDCGuard(rng_hook=sdcguard.RngHook(get=..., set=...)))")
    if ops:
        causes.append("order-dependent ops ran: " + ", ".join(ops) + " (their GPU kernels sum with atomics)")
    if not torch.are_deterministic_algorithms_enabled():
        causes.append("deterministic algorithms are off (torch.use_deterministic_algorithms(True))")
    if device.type == "cuda":
        if not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
            causes.append("CUBLAS_WORKSPACE_CONFIG is not set (use :4096:8)")
        if torch.backends.cudnn.benchmark:
            causes.append("torch.backends.cudnn.benchmark is on")
    if _GENERATOR not in ops_seen:
        causes.append("randomness the guard does not capture (a generator of the model's own, or a custom op whose "
                      "result depends on timing or order; pass rng_hook= for extra random state)")
    return causes


def setup_warnings(device: torch.device) -> list[str]:
    """What makes CUDA replays nondeterministic, checked before training (empty off CUDA)."""
    if device.type != "cuda":
        return []
    out = []
    if not torch.are_deterministic_algorithms_enabled():
        out.append("torch.use_deterministic_algorithms(True) is off")
    if not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        out.append("CUBLAS_WORKSPACE_CONFIG is unset (set it to :4096:8)")
    return out


State = Literal["unknown", "deterministic", "nondeterministic"]


class Determinism:
    """What the guard has learnt about this setup (see the module docstring)."""

    def __init__(self, window: int = 20) -> None:
        self.state: State = "unknown"
        self.causes: tuple[str, ...] = ()
        self.reason: str | None = None
        self.window = window
        """Samples over which blame naming two different devices is taken for software, not hardware."""
        self._blamed: collections.deque[tuple[int, frozenset[int]]] = collections.deque()

    def agreed(self) -> None:
        """A sampled round whose replays all agreed."""
        if self.state == "unknown":
            self.state = "deterministic"

    def blamed(self, sample: int, ranks: set[int]) -> str | None:
        """A round named ``ranks``; the reason to suspect software when blame moves between devices."""
        while self._blamed and self._blamed[0][0] <= sample - self.window:
            self._blamed.popleft()
        self._blamed.append((sample, frozenset(ranks)))
        named = set().union(*(r for _, r in self._blamed))
        if len(named) < 2:
            return None
        return (f"replay mismatches named {len(named)} different devices (ranks "
                f"{', '.join(map(str, sorted(named)))}) within {self.window} samples: faulty hardware is one device, "
                "this moves from device to device")

    def declare(self, reason: str, causes: list[str]) -> bool:
        """Mark the setup nondeterministic; True the first time (the caller says so, once)."""
        first = self.state != "nondeterministic"
        self.state, self.reason, self.causes = "nondeterministic", reason, tuple(causes)
        return first

    def warn(self) -> None:
        msg = (f"sdcguard: replays on this setup are not bit-identical ({self.reason}). No device is blamed for it "
               "and no step is vetoed for it; replay checks are off for this run, cross-replica checks stay on. "
               f"Likely causes: {'; '.join(self.causes)}")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state, "causes": list(self.causes), "reason": self.reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state.get("state", "unknown")
        self.causes = tuple(state.get("causes", ()))
        self.reason = state.get("reason")
        self._blamed.clear()


def calibrate(comm: Comm, replay_fn: Any, cap: Capture, device: torch.device, *, record_ops: bool) -> CalibrationReport:
    """Replay one clean micro-batch twice on each rank and once on a peer (collective over ``comm``)."""
    recorder = OpRecorder() if record_ops else None
    if recorder is not None:
        with recorder:
            first: Digest = replay_fn(cap, True)
    else:
        first = replay_fn(cap, True)
    again: Digest = replay_fn(cap, True)
    W, me, members = comm.size, comm.index, comm.members
    if W > 1:
        theirs = comm.exchange_objects(cap, dst=peer_target(me, 0, W), src=peer_source(me, 0, W))
        cross_mine: Digest = replay_fn(theirs, False)
    else:
        cross_mine = first
    gathered = comm.gather_objects((first, cross_mine, first == again, sorted(recorder.seen) if recorder else []))
    same_device = all(g[2] for g in gathered)
    differing = [members[r] for r in range(W) if not gathered[r][2]]
    cross = True
    for r in range(W):
        p = peer_source(r, 0, W) if W > 1 else r
        if gathered[r][1] != gathered[p][0]:
            cross = False
            differing.append(members[p])
    deterministic = same_device and cross
    causes = [] if deterministic else likely_causes({op for g in gathered for op in g[3]}, device)
    return CalibrationReport(deterministic=deterministic, same_device=same_device, cross_rank=cross,
                             causes=tuple(causes), ranks_differing=tuple(sorted(set(differing))))
