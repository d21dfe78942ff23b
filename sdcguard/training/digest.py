"""What one computation of one micro-batch gives the checks: its :class:`Digest` (exact fingerprints of its loss and
its local gradients, one per *unit*) and the :class:`LocalRecord` the hooks write them into on the device.

A *unit* is the smallest piece whose local gradient is fingerprinted on its own: a parameter under DDP (or in one
process), one FSDP module's reduce-scatter input under FSDP2/HSDP. A :class:`LocalRecord` holds one fingerprint per
unit, on the device, written by the hooks while a recorded backward runs (no host synchronisation, no copy of any
gradient). Units without a gradient keep the value 0.

A record holds fingerprints on one or two *bases* (:data:`Basis`): ``"handed_over"``, each unit's local gradient as
the framework hands it to its communication (the only basis under DDP, where that is each parameter's gradient of
one micro-batch), and ``"produced"``, each parameter's gradient of one micro-batch as autograd produces it, before
the framework accumulates it, folded per unit in parameter order. Under FSDP2 the two differ when micro-batches are
accumulated without gradient sync: the reduce-scatter input is then their sum, which no replay of one micro-batch
reproduces, while the produced gradient is the micro-batch's own (:mod:`sdcguard.training.hooks.fsdp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..fingerprints import combine_on_device, fingerprints_on_device, unsigned64

__all__ = ["Basis", "BASES", "Digest", "LocalRecord"]

Basis = Literal["handed_over", "produced"]
"""What a unit's fingerprint is of (see the module docstring)."""
BASES: tuple[Basis, ...] = ("handed_over", "produced")


@dataclass(frozen=True, eq=False)
class Digest:
    """Exact fingerprints of one computation of one micro-batch: its loss and its local gradients.

    ``units`` has one fingerprint per unit (0: the unit got no gradient). Two digests are equal when their units
    are, and their losses when both are known (an adapter may not see the framework's loss).
    """

    loss: int | None
    units: tuple[int, ...]
    trace: tuple[int, ...] = ()
    """What this computation put into its unit's collectives, one fingerprint each, in call order
    (:mod:`.replay.collectives`; empty outside a unit). Not part of equality: it locates a disagreement."""

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
    """One fingerprint per unit for one recorded backward, kept on the device until :meth:`digest` is asked for.

    ``bases``: what the record keeps (a replay keeps the one basis its original is compared on; an original under
    FSDP2 keeps both, and :meth:`select` says which one it is compared on once the step showed it).
    """

    def __init__(self, count: int, device: torch.device, *, bases: tuple[Basis, ...] = ("handed_over",)) -> None:
        if not bases or any(b not in BASES for b in bases):
            raise ValueError(f"bases must be some of {BASES}, got {bases!r}")
        self.bases = bases
        self.basis: Basis = bases[0]
        """The basis :meth:`digest`, :meth:`combined` and :attr:`seen` read."""
        self.fps = torch.zeros(count, dtype=torch.int64, device=device)
        """Handed-over basis: one fingerprint per unit."""
        self._seen = {b: [False] * count for b in bases}
        """Host-side, per basis: which units got a gradient (no device read needed to know)."""
        self._parts: dict[int, dict[int, torch.Tensor]] = {}
        """Produced basis: unit -> parameter index -> fingerprint (0-d int64 on the device)."""
        self.loss: torch.Tensor | None = None
        """Fingerprint of the loss (0-d int64 on the device), when the caller saw the loss."""
        self._trace: list[torch.Tensor] = []
        """One fingerprint (0-d int64 on the device) per collective of the unit, in call order."""

    @property
    def seen(self) -> list[bool]:
        """Which units got a gradient, on the selected basis."""
        return self._seen[self.basis]

    def saw(self, basis: Basis) -> bool:
        """Whether any unit got a gradient on ``basis`` (False for a basis the record does not keep)."""
        return any(self._seen.get(basis, ()))

    def select(self, basis: Basis) -> None:
        """Compare on ``basis`` from now on (one the record keeps)."""
        if basis not in self.bases:
            raise ValueError(f"this record keeps {self.bases}, not {basis!r}")
        self.basis = basis

    def add(self, index: int, grad: torch.Tensor) -> None:
        """Fingerprint ``grad``, unit ``index``'s local gradient as the framework hands it over, on the device; a second
        gradient for the same unit in one recorded window (a unit reached by two backward passes) is folded into the
        first. Ignored by a record that does not keep the handed-over basis."""
        if "handed_over" not in self._seen:
            return
        value = fingerprints_on_device([grad.detach()]).to(self.fps.device)
        if self._seen["handed_over"][index]:
            value = combine_on_device(torch.stack([self.fps[index], value[0]])).reshape(1)
        self.fps[index : index + 1] = value
        self._seen["handed_over"][index] = True

    def add_part(self, index: int, part: int, grad: torch.Tensor) -> None:
        """Fingerprint ``grad``, parameter ``part``'s gradient in unit ``index`` as autograd produced it (the produced
        basis); a second one for the same parameter in one window is folded in. Ignored by a record that does not
        keep the produced basis."""
        if "produced" not in self._seen:
            return
        value = fingerprints_on_device([grad.detach()]).to(self.fps.device)[0]
        parts = self._parts.setdefault(index, {})
        if part in parts:
            value = combine_on_device(torch.stack([parts[part], value]))
        parts[part] = value
        self._seen["produced"][index] = True

    def add_contribution(self, inputs: list[torch.Tensor]) -> None:
        """Fingerprint what this rank put into one collective of its unit (its inputs, folded), on the device."""
        value = fingerprints_on_device([t.detach() for t in inputs]).to(self.fps.device)
        self._trace.append(combine_on_device(value) if len(inputs) > 1 else value[0])

    def set_loss(self, loss: torch.Tensor) -> None:
        self.loss = fingerprints_on_device([loss.detach()]).to(self.fps.device)[0]

    def _values(self) -> torch.Tensor:
        """The unit fingerprints on the selected basis (on the device)."""
        if self.basis == "handed_over":
            return self.fps
        fps = torch.zeros_like(self.fps)
        for index, parts in self._parts.items():  # parameter order, not the order autograd reached them in
            fps[index] = combine_on_device(torch.stack([parts[k] for k in sorted(parts)]))
        return fps

    def combined(self) -> torch.Tensor:
        """All unit fingerprints folded into one 0-d int64 (on the device)."""
        return combine_on_device(self._values())

    def digest(self) -> Digest:
        """The host-side digest on the selected basis (one host synchronisation)."""
        units = tuple(unsigned64(v) for v in self._values().tolist())
        loss = None if self.loss is None else unsigned64(int(self.loss))
        trace = tuple(unsigned64(v) for v in torch.stack(self._trace).tolist()) if self._trace else ()
        return Digest(loss=loss, units=units, trace=trace)
