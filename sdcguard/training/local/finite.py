"""A non-finite loss or gradient never commits silently: every rank adds to the step's one gather how many of its
losses (every micro-batch's, as observed) and of the gradients the optimizer will read were not finite, and a step
with any is vetoed on every rank and reported (:func:`~..verdicts.local.nonfinite_incidents` says whom it names).
The cost is one read of the rank's gradients, on the device, no sync before the gather: each gradient is summed
(in float32, float64 for float64) and the sums' sum tested, as a NaN or an infinity never sums to a finite value
(and finite float32 gradients sum to an infinity only past 3e38, which no sane step reaches).

A loss scaler (a ``GradScaler`` in float16) makes some gradients infinite on purpose and skips those steps itself;
where the backward started from a seed above 1 (the scaled loss), non-finite gradients are left to it (a non-finite
loss, taken before the scaling, still counts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...fingerprints import local_tensor
from ..step_check import CheckResult, StepState
from ..verdicts.local import Identity, nonfinite_incidents

__all__ = ["NonFiniteCheck"]


class NonFiniteCheck:
    """Non-finite losses and gradients on this rank (a step check, slice ``"nonfinite"``)."""

    name = "nonfinite"

    def __init__(
        self,
        gradients: Callable[[], list[torch.Tensor | None]],
        identities: Sequence[Identity],
        job: str | None,
        device: torch.device,
    ) -> None:
        self.gradients = gradients
        """The gradients the optimizer will read (this rank's part)."""
        self.identities = list(identities)
        self.job = job
        self.device = device

    def columns(self, state: StepState) -> torch.Tensor:
        grads = [local_tensor(g) for g in self.gradients() if g is not None and g.layout == torch.strided]
        sums = [
            g.sum(dtype=torch.float64 if g.dtype == torch.float64 else torch.float32)
            for g in grads
            if g.is_floating_point()
        ]
        total = torch.stack([s.to(self.device) for s in sums]).sum() if sums else torch.zeros((), device=self.device)
        bad = (~torch.isfinite(total)).to(torch.int64)
        counts = state.nonfinite
        if counts is None:
            counts = torch.zeros(2, dtype=torch.int64, device=self.device)
        lost, scaled = counts.to(self.device, torch.int64).unbind()
        return torch.stack([lost, bad * (scaled == 0)])

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        found = nonfinite_incidents(state.step, rows, self.identities, self.job)
        return CheckResult(incidents=tuple(found), veto=bool(found), ran="nonfinite")
