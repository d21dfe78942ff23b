"""What one computation of one micro-batch gives the checks: its :class:`Digest` (exact fingerprints of its loss and
its local gradients, one per *unit*) and the :class:`LocalRecord` the hooks write them into on the device.

A *unit* is the smallest piece whose local gradient is fingerprinted on its own: a parameter under DDP (or in one
process), one FSDP module's reduce-scatter input under FSDP2/HSDP. A :class:`LocalRecord` holds one fingerprint per
unit, on the device, written by the hooks while a recorded backward runs (no host synchronisation, no copy of any
gradient). Units without a gradient keep the value 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fingerprints import combine_on_device, fingerprints_on_device, unsigned64

__all__ = ["Digest", "LocalRecord"]


@dataclass(frozen=True, eq=False)
class Digest:
    """Exact fingerprints of one computation of one micro-batch: its loss and its local gradients.

    ``units`` has one fingerprint per unit (0: the unit got no gradient). Two digests are equal when their units
    are, and their losses when both are known (an adapter may not see the framework's loss).
    """

    loss: int | None
    units: tuple[int, ...]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Digest):
            return NotImplemented
        if self.units != other.units:
            return False
        return self.loss is None or other.loss is None or self.loss == other.loss

    def __hash__(self) -> int:
        return hash(self.units)

    def first_difference(self, other: Digest) -> int | None:
        """Index of the first unit whose gradient differs (None: only the loss differs, or nothing)."""
        return next((i for i, (a, b) in enumerate(zip(self.units, other.units)) if a != b), None)


class LocalRecord:
    """One fingerprint per unit for one recorded backward, kept on the device until :meth:`units` is asked for."""

    def __init__(self, count: int, device: torch.device) -> None:
        self.fps = torch.zeros(count, dtype=torch.int64, device=device)
        self.seen = [False] * count
        """Host-side: which units got a gradient (no device read needed to know)."""
        self.loss: torch.Tensor | None = None
        """Fingerprint of the loss (0-d int64 on the device), when the caller saw the loss."""

    def add(self, index: int, grad: torch.Tensor) -> None:
        """Fingerprint ``grad`` into unit ``index`` on the device; a second gradient for the same unit in one recorded
        window (a unit reached by two backward passes) is folded into the first."""
        value = fingerprints_on_device([grad.detach()]).to(self.fps.device)
        if self.seen[index]:
            value = combine_on_device(torch.stack([self.fps[index], value[0]])).reshape(1)
        self.fps[index : index + 1] = value
        self.seen[index] = True

    def set_loss(self, loss: torch.Tensor) -> None:
        self.loss = fingerprints_on_device([loss.detach()]).to(self.fps.device)[0]

    def combined(self) -> torch.Tensor:
        """All unit fingerprints folded into one 0-d int64 (on the device)."""
        return combine_on_device(self.fps)

    def digest(self) -> Digest:
        """The host-side digest (one host synchronisation)."""
        units = tuple(unsigned64(v) for v in self.fps.tolist())
        loss = None if self.loss is None else unsigned64(int(self.loss))
        return Digest(loss=loss, units=units)
