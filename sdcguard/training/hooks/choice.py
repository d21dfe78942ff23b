"""Which hooks watch a model: FSDP2's custom reduce-scatter (:mod:`.fsdp`) or a tensor hook per parameter
(:mod:`.ddp`), chosen from what the model is wrapped in (:mod:`.wrappers`), with what its replays run through."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...errors import BadInput
from .ddp import ParamTaps, is_ddp
from .fsdp import FSDPTaps, is_fsdp
from .wrappers import peel, refuse_unsupported, unwrap_to_ddp

__all__ = ["Wiring", "choose_taps"]


@dataclass(frozen=True)
class Wiring:
    """A model's hooks and what they watch."""

    core: nn.Module
    """The module inside every compile and DDP wrapper (FSDP2's root module, for FSDP2)."""
    taps: ParamTaps | FSDPTaps
    ddp: DistributedDataParallel | None
    """The model's own DDP wrapper, when it has one (also inside ``torch.compile``)."""


def choose_taps(model: nn.Module, *, dedicated_shadows: bool) -> Wiring:
    """The hooks of ``model`` (as the loop calls it). A compiled model is unwrapped to find what it wraps, and
    replays run through its compiled code: ``torch.compile(DDP(m))`` through DDP under ``no_sync()``,
    ``DDP(torch.compile(m))`` through the compiled module, ``torch.compile(fully_shard(m))`` through the compiled
    FSDP2 module; a plain DDP model's replays skip DDP's reducer."""
    refuse_unsupported(model)
    core, layers = peel(model)
    compiled_outside = layers[:1] == ("compiled",)
    ddp = unwrap_to_ddp(model) if "ddp" in layers else None
    if is_fsdp(core):
        if dedicated_shadows:
            raise BadInput("dedicated shadows replay a whole model on one device: use peer mode with FSDP2")
        return Wiring(core, FSDPTaps(core, replay_module=model if compiled_outside else None), None)
    named = [(n, p) for n, p in core.named_parameters() if p.requires_grad]
    if not named:
        raise BadInput("the model has no parameter that requires a gradient")
    if ddp is not None and compiled_outside:  # torch.compile(DDP(m)): replay the compiled code, DDP quiet
        return Wiring(core, ParamTaps(core, named, replay_module=model, replay_context=ddp.no_sync), ddp)
    inner = model
    while is_ddp(inner):
        inner = inner.module
    return Wiring(core, ParamTaps(core, named, replay_module=inner), ddp)
