"""Capture what a replay needs: the micro-batch and every random-number state, taken just before a forward pass.

A replay on another device must see exactly the inputs, random draws (dropout masks), mixed-precision state and
backward seed of the original computation. :class:`Capture` holds the micro-batch (a tensor or any nesting of
tuples, lists and dicts of tensors), the Python, NumPy, torch CPU and CUDA generator states, the state of a user
hook for anything else that draws random numbers (a tensor-parallel RNG tracker, for instance), the autocast state
the forward ran under (:class:`AutocastState`, read inside the forward by :class:`AutocastProbe`) and the *seed*:
the gradient that flowed into the loss in the original backward (``1/k`` with ``k`` accumulated micro-batches, times
a ``GradScaler``'s scale), observed by a hook on the loss tensor. Captures are picklable with the batch on the CPU,
so they travel between ranks; :func:`rng_replayed` and :func:`autocast_replayed` apply one for the span of a replay
and then put the current state back, so a replay never shifts the training run's own random stream.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..digest import Basis

__all__ = [
    "RngHook",
    "RngState",
    "AutocastState",
    "capture_autocast",
    "autocast_replayed",
    "AutocastProbe",
    "Capture",
    "capture_rng",
    "restore_rng",
    "rng_replayed",
    "make_capture",
    "batch_for_replay",
    "map_tensors",
]

Batch = Any
"""A tensor, or a tuple / list / dict (nested at will) whose leaves are tensors or plain Python values."""


@dataclass(frozen=True, kw_only=True)
class RngHook:
    """Extra random state the guard must capture and restore (for instance a tensor-parallel RNG tracker).

    ``get`` returns a picklable snapshot; ``set`` puts a snapshot back. Both run on every rank.
    """

    get: Callable[[], Any]
    set: Callable[[Any], None]

    def __post_init__(self) -> None:
        if not callable(self.get) or not callable(self.set):
            raise TypeError("RngHook needs two callables: get() -> state and set(state)")


@dataclass(frozen=True, kw_only=True)
class RngState:
    """Every generator state at one instant of one rank."""

    python: Any
    numpy: Any
    torch_cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...] = ()
    """One state per visible CUDA device (empty when CUDA is not initialised)."""
    cuda_current: int | None = None
    """Index of the current CUDA device: the one a replay on another rank maps onto its own current device."""
    extra: Any = None
    """What the user's :class:`RngHook` returned, if one was given."""


_AUTOCAST_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class AutocastState:
    """Whether autocast was on, and its dtype, for each device type (the mixed precision a forward ran under)."""

    enabled: tuple[bool, ...]
    dtypes: tuple[str, ...]
    """dtype names (``bfloat16``), one per entry of ``_AUTOCAST_DEVICES``."""


def capture_autocast() -> AutocastState:
    """The autocast state right now (call it inside the forward it describes)."""
    enabled, dtypes = [], []
    for dev in _AUTOCAST_DEVICES:
        enabled.append(bool(torch.is_autocast_enabled(dev)))
        dtypes.append(str(torch.get_autocast_dtype(dev)).removeprefix("torch."))
    return AutocastState(enabled=tuple(enabled), dtypes=tuple(dtypes))


@contextlib.contextmanager
def autocast_replayed(state: AutocastState | None) -> Iterator[None]:
    """Run the body under the captured autocast state (entering or leaving autocast as needed)."""
    if state is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        for dev, on, dtype in zip(_AUTOCAST_DEVICES, state.enabled, state.dtypes):
            if dev == "cuda" and not torch.cuda.is_available():
                continue
            if on or torch.is_autocast_enabled(dev):
                stack.enter_context(torch.autocast(dev, dtype=getattr(torch, dtype), enabled=on))
        yield


class AutocastProbe:
    """Read the autocast state inside the next module forward that runs (a global forward pre-hook that removes
    itself after one call): the state a framework's training step runs under, which is not visible from its
    callbacks. ``probe.state`` is None until a forward ran."""

    def __init__(self) -> None:
        self.state: AutocastState | None = None
        self._handle: torch.utils.hooks.RemovableHandle | None = (
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre)
        )

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.state is None:
            self.state = capture_autocast()
        self.remove()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


@dataclass(frozen=True, kw_only=True)
class Capture:
    """One micro-batch of one rank at one step, with what it takes to recompute it bit for bit elsewhere."""

    step: int
    rank: int
    """Rank (within the data-parallel group) that computed the original."""
    micro_batch: int
    """Index of the micro-batch within the step (0 without gradient accumulation)."""
    batch: Batch
    """The micro-batch, with every tensor on the CPU (see :func:`make_capture`)."""
    rng: RngState
    autocast: AutocastState | None = None
    """The autocast state inside the original forward (None: not observed; a replay then leaves autocast alone)."""
    seed: torch.Tensor | None = None
    """The gradient that flowed into the loss in the original backward (a 0-d CPU tensor; None: one)."""
    on_device: tuple[bool, ...] = field(default=())
    """Per tensor leaf (in traversal order): was it on an accelerator? The replay moves those to its own device."""
    basis: Basis = "handed_over"
    """What the original's local gradients were fingerprinted as, so what a replay fingerprints
    (:data:`~sdcguard.training.digest.Basis`): ``"produced"`` where the framework accumulated the micro-batch with
    others before handing it over (FSDP2 without gradient sync)."""


def map_tensors(obj: Batch, fn: Callable[[torch.Tensor], Any]) -> Batch:
    """Apply ``fn`` to every tensor leaf of a nested batch, keeping the container types (and namedtuples)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict) and type(obj) is dict:
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, Mapping):  # OrderedDict, BatchEncoding-like mappings
        rebuild: Callable[..., Batch] = type(obj)  # such a mapping's class takes (key, value) pairs
        return rebuild((k, map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def _leaves(obj: Batch) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    map_tensors(obj, lambda t: out.append(t))
    return out


def capture_rng(hook: RngHook | None = None) -> RngState:
    """Snapshot every generator this process uses (call it right before the forward pass it describes)."""
    cuda: tuple[torch.Tensor, ...] = ()
    current: int | None = None
    # Only touch CUDA when it is already initialised: capturing must not create a context on a CPU-only rank.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = tuple(torch.cuda.get_rng_state_all())
        current = torch.cuda.current_device()
    return RngState(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch_cpu=torch.random.get_rng_state(),
        cuda=cuda,
        cuda_current=current,
        extra=hook.get() if hook is not None else None,
    )


def restore_rng(state: RngState, hook: RngHook | None = None, *, same_process: bool = True) -> None:
    """Put a snapshot back.

    ``same_process=False`` is a replay of another rank's capture: only that rank's *current* CUDA device state is
    applied, to this process's current device (rank ``r`` uses ``cuda:r``, the replaying rank its own).
    """
    random.setstate(state.python)
    np.random.set_state(state.numpy)
    torch.random.set_rng_state(state.torch_cpu)
    if state.cuda and torch.cuda.is_available():
        if same_process:
            torch.cuda.set_rng_state_all(list(state.cuda))
        elif state.cuda_current is not None:
            torch.cuda.set_rng_state(state.cuda[state.cuda_current], device=torch.cuda.current_device())
    if hook is not None and state.extra is not None:
        hook.set(state.extra)


@contextlib.contextmanager
def rng_replayed(state: RngState, hook: RngHook | None = None, *, same_process: bool = True) -> Iterator[None]:
    """Run the body with ``state`` applied, then restore the states that were current before.

    The training run's own random stream is untouched: a guarded run draws the same dropout masks as an unguarded
    one.
    """
    saved = capture_rng(hook)
    restore_rng(state, hook, same_process=same_process)
    try:
        yield
    finally:
        restore_rng(saved, hook, same_process=True)


def make_capture(*, step: int, rank: int, micro_batch: int, batch: Batch, rng: RngState) -> Capture:
    """A portable capture: tensors copied to the CPU (detached), accelerator leaves remembered."""
    leaves = _leaves(batch)
    on_device = tuple(t.device.type != "cpu" for t in leaves)
    # clone(): the caller may reuse or modify its batch buffers after the step.
    portable = map_tensors(batch, lambda t: t.detach().to("cpu", copy=True))
    return Capture(step=step, rank=rank, micro_batch=micro_batch, batch=portable, rng=rng, on_device=on_device)


def batch_for_replay(capture: Capture, device: torch.device) -> Batch:
    """The capture's batch with the leaves that lived on an accelerator moved to ``device`` (this rank's own)."""
    flags = iter(capture.on_device)

    def move(t: torch.Tensor) -> torch.Tensor:
        moved = next(flags, False)
        return t.to(device) if moved and device.type != "cpu" else t

    return map_tensors(capture.batch, move)
