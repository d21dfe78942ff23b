"""What every parallelism's hooks provide the guard: local-gradient fingerprints taken where the framework hands the
gradients over, a replay backward that reduces and accumulates nothing, and the tensors the optimizer will read.

A *unit* is the smallest piece whose local gradient is fingerprinted on its own: a parameter under DDP (or in one
process), one FSDP module's reduce-scatter input under FSDP2/HSDP. A :class:`LocalRecord` holds one fingerprint per
unit, on the device, written by the hooks while a recorded backward runs (no host synchronisation, no copy of any
gradient). Units without a gradient keep the value 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from ..digest import LocalRecord

__all__ = ["Taps"]


class Taps(Protocol):
    """The hooks of one parallelism (:class:`~.ddp.ParamTaps`, :class:`~.fsdp.FSDPTaps`)."""

    # Read-only to the guard: properties here, so an implementation's plain list attributes satisfy the protocol
    # (a mutable protocol attribute would have to be exactly Sequence).
    @property
    def unit_names(self) -> Sequence[str]:
        """Name of each unit, for incidents (a parameter name, or an FSDP module's name)."""

    @property
    def params(self) -> Sequence[nn.Parameter]:
        """The trainable parameters (this rank's part), in a fixed order."""

    @property
    def param_names(self) -> Sequence[str]:
        """Their names."""

    collective_replay: bool
    """True when a replay runs collectives (FSDP all-gathers): every rank must replay at the same time."""
    replay_module: nn.Module
    """What ``loss_fn`` receives for a replay: the module without data-parallel wrapper (DDP), or the sharded
    module itself (FSDP); a compiled model's compiled code (:mod:`.wrappers`)."""

    def replay_context(self) -> contextlib.AbstractContextManager[object]:
        """The context a replay runs in (``torch.compile(DDP(m))`` replays through DDP under ``no_sync()``)."""

    handed_over: int
    """How many local gradients the framework has handed over so far (replays not counted): a micro-batch whose
    backward hands none over was accumulated without reduction (FSDP2 without gradient sync), so the step's
    local gradients are handed over only as a sum, which no replay of one micro-batch reproduces."""
    produces: bool
    """True when the hooks also see each parameter's gradient as autograd produces it, before the framework
    accumulates it (the ``"produced"`` basis of :class:`LocalRecord`: FSDP2's unsharded parameters), where the
    handed-over one can differ from it. False where the two are one (DDP's tensor hooks)."""

    def arm(self, record: LocalRecord | None) -> None:
        """From now on, local gradients are fingerprinted into ``record`` on the bases it keeps (None: stop); arming
        again with the same record is harmless (FSDP2 finds the parameters its forward made)."""

    def replay_backward(self, loss: torch.Tensor, seed: torch.Tensor | None, record: LocalRecord) -> None:
        """Backward of a replay: fingerprint its local gradients into ``record`` on its basis; reduce, accumulate and
        keep nothing (no ``.grad`` changes, no communication of gradients)."""

    def reduced(self) -> list[torch.Tensor | None]:
        """The gradients the optimizer will read (this rank's part), one per parameter."""

    def weights(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates (this rank's part), in the same order."""

    def close(self) -> None:
        """Remove every hook."""
