"""What a model is wrapped in, read before the guard chooses its hooks: ``torch.compile`` (an ``OptimizedModule``, or
a module compiled in place with ``module.compile()``), DDP, FSDP2, and what the guard refuses (FSDP1).

A compiled model is unwrapped to find what it wraps (``torch.compile(DDP(m))``, ``DDP(torch.compile(m))``,
``torch.compile(fully_shard(m))``), and replays run through the compiled code, so they compute what the step computed
(compiled kernels differ from eager ones in their last bits). A dispatch mode active while compiled code runs makes
torch run it differently (it retraces under the mode), so the matmul checksums leave compiled regions alone: a model
with compiled regions is not checksum-checked (:func:`has_compiled_regions`), and says so.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...errors import BadInput

__all__ = ["is_compiled", "has_compiled_regions", "peel", "unwrap_to_ddp", "refuse_unsupported", "imported"]


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile``'s wrapper (an ``OptimizedModule``)."""
    return type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module)


def _inner(compiled: nn.Module) -> nn.Module:
    inner = compiled._orig_mod
    assert isinstance(inner, nn.Module)
    return inner


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether any part of ``module`` runs compiled: a ``torch.compile`` wrapper, or a module compiled in place."""
    return any(is_compiled(m) or getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def peel(model: nn.Module) -> tuple[nn.Module, tuple[str, ...]]:
    """The module inside every ``torch.compile`` and DDP wrapper of ``model``, and those wrappers, outside in
    (``"compiled"``, ``"ddp"``)."""
    layers: list[str] = []
    while True:
        if is_compiled(model):
            layers.append("compiled")
            model = _inner(model)
        elif isinstance(model, DistributedDataParallel):
            layers.append("ddp")
            model = model.module
        else:
            return model, tuple(layers)


def unwrap_to_ddp(model: nn.Module) -> DistributedDataParallel:
    """The DDP wrapper inside ``model``'s ``torch.compile`` wrappers."""
    while not isinstance(model, DistributedDataParallel):
        if not is_compiled(model):
            raise ValueError("no DDP wrapper inside the compiled model")
        model = _inner(model)
    return model


def imported(module: str, name: str) -> Any:
    """``module.name`` if ``module`` is imported already, else None: what a model may be wrapped in, read without
    importing the wrapper's package. A model is an FSDP module only if the job imported ``torch.distributed.fsdp``;
    the guard importing it instead, after ``init_process_group``, would keep the job's gloo group alive past
    ``destroy_process_group()`` (``torch.distributed.nn.functional``, which it imports, binds ``group.WORLD`` as its
    functions' default argument at import time), and a gloo worker thread still alive when the interpreter is
    finalized can abort the process at exit ("terminate called without an active exception")."""
    return getattr(sys.modules.get(module), name, None)


def _fsdp1_type() -> Any:
    return imported("torch.distributed.fsdp", "FullyShardedDataParallel")


def refuse_unsupported(model: nn.Module) -> None:
    """One clear line for a model the guard cannot watch: FSDP1 (``FullyShardedDataParallel``) anywhere in it."""
    fsdp1 = _fsdp1_type()
    if fsdp1 is not None and any(isinstance(m, fsdp1) for m in model.modules()):
        raise BadInput(
            "FSDP1 (FullyShardedDataParallel) is not supported: its flat parameters hide which gradient is which, "
            "and its reduce-scatter cannot be observed; shard the model with FSDP2 (torch.distributed.fsdp."
            "fully_shard), which the guard watches (Lightning: ModelParallelStrategy; Accelerate: fsdp_version=2)"
        )
