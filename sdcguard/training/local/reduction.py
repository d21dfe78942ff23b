"""The gradient's path into DDP's reduction, as a step check: each rank says how many of the parameters it compared
(:class:`~..hooks.bucket.ReductionWatch`) reached DDP's all-reduce other than its backward produced them, and a rank
with any is named alone, the step vetoed on every rank (:func:`~..verdicts.local.reduction_incidents`). Three
integers per rank in the step's one gather; zeros where no DDP reduction is watched (FSDP2, a single process, a DDP
model with a comm hook of its own)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..hooks.bucket import ReductionWatch
from ..step_check import CheckResult, StepState
from ..verdicts.local import Identity, reduction_incidents

__all__ = ["ReductionCheck"]


class ReductionCheck:
    """This rank's gradients as DDP reduced them against its backward's (a step check, slice ``"reduction"``)."""

    name = "reduction"

    def __init__(
        self,
        watch: ReductionWatch | None,
        names: Sequence[str],
        identities: Sequence[Identity],
        job: str | None,
        device: torch.device,
    ) -> None:
        self.watch = watch
        """The taps' watch (None: the parallelism's reduction is not a DDP one)."""
        self.names = list(names)
        self.identities = list(identities)
        self.job = job
        self.device = device
        self.named: frozenset[int] = frozenset()
        """The global ranks the last check named (the same on every rank)."""

    def columns(self, state: StepState) -> torch.Tensor:
        if self.watch is None:
            return torch.zeros(3, dtype=torch.int64, device=self.device)
        return self.watch.take().to(self.device)

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        found = reduction_incidents(state.step, rows, self.names, self.identities, self.job, before=self.named)
        self.named = frozenset(r for i in found for r in i.suspect_ranks)
        ran = any(row[0] > 0 for row in rows)
        return CheckResult(incidents=tuple(found), veto=bool(found), ran="reduction" if ran else None)
