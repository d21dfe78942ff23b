"""What workers and a dedicated shadow send each other: the sample (capture, step, original digest), a request for
a kept sample, the shadow's verdict (a fixed-size int64 tensor on the wire), an escalation (the workers raise or
exit, so the shadow does too), and the flat per-dtype buffers that carry the parameters in one message each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ...records import Incident
from ..digest import Digest
from ..replay.capture import Capture

__all__ = ["ShadowSample", "Fetch", "Escalation", "Reform", "Verdict", "VERDICT_LEN", "flat_buffers", "flat_views"]

VERDICT_LEN = 5  # [sample, step, matched, first_unit, loss_differs]


@dataclass(frozen=True, kw_only=True)
class ShadowSample:
    """What a worker sends a shadow on a sampled step (the parameters follow, one tensor each, in order)."""

    sample: int
    step: int
    capture: Capture
    original: Digest


@dataclass(frozen=True)
class Fetch:
    """A worker asks a shadow for a sample it kept after a disagreement."""

    sample: int


@dataclass(frozen=True, kw_only=True)
class Escalation:
    """A worker's last message to a shadow: the job raises (``CorruptionDetected``) or exits (the exit-code
    contract) at this step, for these incidents; the shadow does the same once every worker has said so."""

    action: Literal["raise", "exit"]
    incidents: tuple[Incident, ...]
    status: int
    """The shadow's exit status under ``exit`` (the exit-code contract: 86 when it is a suspect, else 85)."""


@dataclass(frozen=True, kw_only=True)
class Reform:
    """A worker's last message to a shadow before a recovery (``escalate="recover"``): the job re-forms by ``plan``
    (a :class:`~sdcguard.training.recovery.plan.RecoveryPlan`) for these incidents; the shadow takes part once
    every worker has said so (it may be promoted to a worker, stay a shadow, or exit)."""

    plan: Any
    incidents: tuple[Incident, ...]

    def fields(self) -> tuple[Any, tuple[Incident, ...]]:
        return self.plan, self.incidents


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A shadow's answer about one sample (an int64 tensor of :data:`VERDICT_LEN` on the wire)."""

    sample: int
    step: int
    matched: bool
    first_unit: int | None
    loss_differs: bool

    def to_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        first = -1 if self.first_unit is None else self.first_unit
        return torch.tensor(
            [self.sample, self.step, int(self.matched), first, int(self.loss_differs)], dtype=torch.int64, device=device
        )

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Verdict:
        v = [int(x) for x in t.cpu().tolist()]
        return cls(
            sample=v[0], step=v[1], matched=bool(v[2]), first_unit=None if v[3] < 0 else v[3], loss_differs=bool(v[4])
        )


def flat_buffers(params: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """One empty flat tensor per run of parameters of equal dtype (in parameter order), on ``device``: what one
    message each carries between a worker and a shadow."""
    flats: list[torch.Tensor] = []
    run: list[torch.Tensor] = []
    for p in [*params, None]:
        if run and (p is None or p.dtype != run[0].dtype):
            flats.append(torch.empty(sum(t.numel() for t in run), dtype=run[0].dtype, device=device))
            run = []
        if p is not None:
            run.append(p)
    return flats


def flat_views(flats: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flats`` shaped like ``params`` (the layout :func:`flat_buffers` made)."""
    out: list[torch.Tensor] = []
    it = iter(flats)
    flat, offset = next(it, None), 0
    for p in params:
        if flat is None or offset == flat.numel() or flat.dtype != p.dtype:
            flat, offset = next(it, None), 0
        if flat is None or offset + p.numel() > flat.numel():
            raise ValueError("parameter layout does not match the flat buffers")
        out.append(flat[offset : offset + p.numel()].view(p.shape))
        offset += p.numel()
    return out
