"""Memory corruption where no replica exists: a rank's own parameter shards are fingerprinted right after the
optimizer step and again at the next step's check, before anything commits.

A rank's shard of the parameters changes only through the optimizer step (and a recovery's restore), so a shard whose
bits changed between the two reads was corrupted in that rank's memory. The rank is named alone, with no vote
(:func:`~..verdicts.local.memory_incidents`), on every layout: DDP and HSDP (where replicas exist too), a pure FSDP2
shard or a tensor-parallel shard that no other rank holds, frozen weights included. The cost per step is two reads
of the rank's local shards (``benchmarks/memory_check.py``); the comparison rides in the step's one gather (two
integers per rank).

While a rank's shards differ from the last fingerprint, that fingerprint is kept (the optimizer step after a veto
does not make the corrupted bits the reference): every later step is vetoed too, until the weights are restored (a
recovery makes a new reference, :meth:`MemoryCheck.forget`). A loop that writes the weights outside the optimizer
(an EMA swap, a parameter average) calls ``after_optimizer_step`` after that write; a step whose loop did not call
it since the last check is not checked (its reference would predate an optimizer step: a false alarm on every
rank). Bits that flip between a step's check and the optimizer's read of the weights are written into the next
reference: only the cross-replica weight check sees those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..replica import fingerprint_column
from ..step_check import CheckResult, StepState
from ..verdicts.local import Identity, memory_incidents

__all__ = ["MemoryCheck"]


class MemoryCheck:
    """This rank's shards against their fingerprint from right after the optimizer step (a step check, slice
    ``"memory"``; see the module docstring)."""

    name = "memory"

    def __init__(
        self,
        shards: Callable[[], list[torch.Tensor]],
        names: Sequence[str],
        identities: Sequence[Identity],
        job: str | None,
        device: torch.device,
        index: int,
    ) -> None:
        self.shards = shards
        """This rank's local shards of every parameter, trained and frozen, in ``names``' order."""
        self.names = list(names)
        self.identities = list(identities)
        self.job = job
        self.device = device
        self.index = index
        """This rank's row in the step's gather."""
        self._reference: torch.Tensor | None = None
        self._held = False
        self._fresh = False
        self.named: frozenset[int] = frozenset()
        """The global ranks the last step's check named (the same on every rank)."""

    def settle(self) -> None:
        """Right after the optimizer step: the shards' fingerprints become the reference (on the device, no sync),
        unless this rank's shards were found changed and not restored since."""
        if not self._held:
            self._reference = fingerprint_column(self.shards(), self.device)
        self._fresh = True

    def forget(self) -> None:
        """The weights were restored (a recovery): no reference until the next :meth:`settle`."""
        self._reference, self._held, self._fresh, self.named = None, False, False, frozenset()

    def columns(self, state: StepState) -> torch.Tensor:
        """``(a reference exists, changed tensors, the first one's index)``; zeros before any reference, or when no
        optimizer step was settled since the last check."""
        if self._reference is None or not self._fresh:
            return torch.zeros(3, dtype=torch.int64, device=self.device)
        changed = fingerprint_column(self.shards(), self.device) != self._reference
        one = torch.ones((), dtype=torch.int64, device=self.device)
        return torch.stack([one, changed.sum(), changed.to(torch.int64).argmax()])

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        found = memory_incidents(state.step, [row[1:] for row in rows], self.names, self.identities, self.job)
        self._held = rows[self.index][1] > 0
        self._fresh = False
        self.named = frozenset(r for i in found for r in i.suspect_ranks)
        ran = any(row[0] for row in rows)
        return CheckResult(incidents=tuple(found), veto=bool(found), ran="memory" if ran else None)
