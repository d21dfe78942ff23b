"""Is this setup bit-reproducible? Exact replay blames hardware for any difference, so it is only sound where healthy
devices reproduce each other bit for bit.

The evidence for software nondeterminism is a device disagreeing with *itself* (the same micro-batch, weights and
device, another result), seen on two or more devices in one settlement (:mod:`.attribution`). When the guard sees
it (:class:`Determinism`), it says so once, loudly, with the likely causes (:func:`likely_causes`), names no device,
vetoes nothing for it, and turns replay off for the run while the cross-replica checks (exact after the all-reduce
whatever the kernels do) stay on. Nothing else turns replay off: not a device named as faulty, not two faulty
devices, not a disagreement nobody can settle.

:func:`calibrate` is the explicit preflight (``guard.calibrate(batch)``): every rank computes the same clean
micro-batch twice on its own device, and the same rule reads the result: which devices reproduced themselves, which
disagree with the majority (hardware), and whether software is to blame (only on self-inconsistency).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...logs import get_logger
from ..comm import Comm
from ..digest import Digest
from ..replay.capture import Capture
from .attribution import Judgement, settle

__all__ = [
    "CalibrationReport",
    "CalibrationRun",
    "Determinism",
    "OpRecorder",
    "calibrate",
    "likely_causes",
    "setup_warnings",
]

_log = get_logger("training")

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
    """No software nondeterminism was seen (a faulty device does not make the setup nondeterministic)."""
    same_device: bool
    """A rerun on each rank's own device reproduced its result bit for bit (on every rank)."""
    cross_rank: bool
    """Every rank computed the same result."""
    causes: tuple[str, ...] = ()
    """Likely reasons when not deterministic."""
    ranks_differing: tuple[int, ...] = ()
    """Global ranks whose results disagree with the majority (hardware), every rank of a disagreement nobody can
    settle (unresolved), or the ranks that did not reproduce themselves (software). Never a rank whose results
    agreed with the majority."""
    inconsistent: tuple[int, ...] = ()
    """Global ranks that did not reproduce their own result."""
    verdict: Literal["deterministic", "hardware", "unresolved", "software"] = "deterministic"
    """``deterministic``: every computation agreed; ``hardware``: a majority of self-consistent devices names the
    odd one(s) (the setup itself is deterministic); ``unresolved``: devices disagree and nothing decides;
    ``software``: two or more devices disagreed with themselves."""
    how: str = ""
    """How the verdict was reached."""

    def __str__(self) -> str:
        if self.verdict == "deterministic":
            return "replays are bit-identical on each rank and across ranks"
        if self.verdict == "software":
            return (
                f"replays are NOT bit-identical on the same device (ranks {list(self.ranks_differing)}); "
                f"likely causes: {'; '.join(self.causes) or 'unknown'}"
            )
        if self.verdict == "hardware":
            return (
                f"the setup replays bit for bit, but ranks {list(self.ranks_differing)} computed wrong results "
                f"({self.how})"
            )
        return f"ranks {list(self.ranks_differing)} disagree and nothing decides between them ({self.how})"


class OpRecorder(TorchDispatchMode):
    """Records which aten ops ran, and whether a random op drew from an explicit ``torch.Generator``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
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
        causes.append(
            "random numbers were drawn from a torch.Generator of the model's own, which the guard does "
            "not capture (capture its state with SDCGuard(rng_hook=sdcguard.RngHook(get=..., set=...)))"
        )
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
        causes.append(
            "randomness the guard does not capture (a generator of the model's own, or a custom op whose "
            "result depends on timing or order; pass rng_hook= for extra random state)"
        )
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

    def __init__(self) -> None:
        self.state: State = "unknown"
        """``deterministic`` once a sampled round's replays all agreed (or calibration said so);
        ``nondeterministic`` once devices were seen disagreeing with themselves."""
        self.causes: tuple[str, ...] = ()
        self.reason: str | None = None

    def agreed(self) -> None:
        """A sampled round whose replays all agreed."""
        if self.state == "unknown":
            self.state = "deterministic"

    def declare(self, reason: str, causes: list[str]) -> bool:
        """Mark the setup nondeterministic; True the first time (the caller says so, once)."""
        first = self.state != "nondeterministic"
        self.state, self.reason, self.causes = "nondeterministic", reason, tuple(causes)
        return first

    def warn(self) -> None:
        msg = (
            f"replays on this setup are not bit-identical ({self.reason}). No device is blamed for it "
            "and no step is vetoed for it; replay checks are off for this run, cross-replica checks stay on. "
            f"Likely causes: {'; '.join(self.causes)}"
        )
        _log.warning("%s", msg)

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state, "causes": list(self.causes), "reason": self.reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state.get("state", "unknown")
        self.causes = tuple(state.get("causes", ()))
        self.reason = state.get("reason")


@dataclass(frozen=True, kw_only=True)
class CalibrationRun:
    """One rank's two computations of the calibration micro-batch, and the aten ops the first ran."""

    first: Digest
    again: Digest
    third: Digest | None = None
    """A third computation, in a single process whose first two differ (see :func:`calibrate`)."""
    ops: tuple[str, ...] = ()

    @property
    def computations(self) -> list[Digest]:
        return [self.first, self.again] + ([self.third] if self.third is not None else [])


def calibrate(
    comm: Comm,
    replay_fn: Callable[[Capture, bool], Digest],
    cap: Capture,
    device: torch.device,
    *,
    record_ops: bool,
    setups: Mapping[int, Hashable] | None = None,
) -> tuple[CalibrationReport, Judgement | None]:
    """Every rank computes the group's first rank's micro-batch twice (collective over ``comm``); the report, and
    the judgement when the computations disagree (None when all agree).

    A single process has one device, whose two computations cannot outvote each other: when they differ it computes
    a third time, and the three vote as :func:`~.attribution.settle` says (two agreeing name the odd one a
    transient fault; all three differing is software), so one differing computation is never called software."""
    cap = comm.broadcast_object(cap if comm.index == 0 else None, src=0)
    recorder = OpRecorder() if record_ops else None
    with recorder if recorder is not None else contextlib.nullcontext():
        first: Digest = replay_fn(cap, comm.index == 0)
    again: Digest = replay_fn(cap, comm.index == 0)
    third = replay_fn(cap, True) if comm.size == 1 and again != first else None  # one process: no collective
    mine = CalibrationRun(first=first, again=again, third=third, ops=tuple(sorted(recorder.seen)) if recorder else ())
    gathered: list[CalibrationRun] = comm.gather_objects(mine)
    computations = {g: e.computations for g, e in zip(comm.members, gathered)}
    if all(d == first for e in gathered for d in e.computations):
        return CalibrationReport(deterministic=True, same_device=True, cross_rank=True, verdict="deterministic"), None
    j = settle(computations, setups)
    if j.verdict == "software":
        differing, causes = j.inconsistent, likely_causes({op for e in gathered for op in e.ops}, device)
    else:
        differing, causes = (tuple(sorted(j.blamed)) if j.verdict == "hardware" else j.suspects), []
    report = CalibrationReport(
        deterministic=j.verdict != "software",
        same_device=not j.inconsistent,
        cross_rank=False,
        causes=tuple(causes),
        ranks_differing=differing,
        inconsistent=j.inconsistent,
        verdict=j.verdict,
        how=j.how,
    )
    return report, j
