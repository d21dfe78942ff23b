"""The fault grid and how each fault reaches the job, at the seams a user has (no private names).

A :class:`Trial` is one faulty unit on one rank: a *target* (an aten op family's outputs in the forward and/or
the framework's own backward, that rank's reduced gradients in memory, its weights in memory, or the all-reduce's
result on that rank), a *bit class* (one value with one flipped bit from the sign, the exponent, the upper or lower
half of the mantissa; the value zeroed; the value turned into NaN; or ``tile``, a control fault: 50-100% of one
32x32 tile of the output, or a 1,024-value run of a 1-d one, each value corrupted as the field study's ``mix``
draws it) and a *timing*:

- ``one-off``: one corrupted computation (the fault model's ``transient``); an op fault hits one op call of the
  step's original forward or backward (the call drawn from the seed), and nothing else;
- ``intermittent``: a flaky unit: every computation it does is hit with probability ``rate``, its re-runs included;
- ``sticky``: a broken unit: every computation it does is hit, re-runs included, with the same wrong bits.

Seams: ops through :class:`~sdcguard.inject.torch_faults.OpFaultMode`; reduced gradients with
:func:`~sdcguard.inject.torch_faults.corrupt_gradients_` between the backward and ``guard.end_step()``; the
collective with :class:`~sdcguard.inject.torch_faults.CorruptingCommHook` behind DDP's public comm hook; weights
with :func:`~sdcguard.inject.torch_faults.corrupt_weights_` after the optimizer step.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OP_TARGETS = ("matmul", "attention", "norm", "activation", "embedding", "loss")
TARGETS = (*OP_TARGETS, "reduced_grad", "weights", "collective")
BIT_CLASSES = ("sign", "exponent", "high_mantissa", "low_mantissa", "zero", "nan", "tile")
TIMINGS = ("one-off", "intermittent", "sticky")
TARGET_LABELS = {
    "matmul": "matmul (mm/addmm/bmm)",
    "attention": "attention (softmax)",
    "norm": "layernorm",
    "activation": "GELU",
    "embedding": "embedding",
    "loss": "loss (log_softmax/nll)",
    "reduced_grad": "one rank's reduced gradients",
    "weights": "one rank's weights",
    "collective": "all-reduce result",
}
GROUPS = {t: "compute" for t in OP_TARGETS} | {
    "reduced_grad": "after the reduction",
    "collective": "after the reduction",
    "weights": "weights in memory",
}


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One fault on one rank (see the module docstring)."""

    target: str
    bits: str
    timing: str
    rank: int
    seed: int
    phase: str = "both"
    """Op faults: ``forward``, ``backward`` (inside the framework's own backward) or ``both``."""

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: use one of {', '.join(TARGETS)}")
        if self.bits not in BIT_CLASSES:
            raise ValueError(f"unknown bit class {self.bits!r}: use one of {', '.join(BIT_CLASSES)}")
        if self.timing not in TIMINGS:
            raise ValueError(f"unknown timing {self.timing!r}: use one of {', '.join(TIMINGS)}")
        if self.phase not in ("forward", "backward", "both"):
            raise ValueError(f"unknown phase {self.phase!r}")

    @property
    def op(self) -> bool:
        return self.target in OP_TARGETS


def fault_model(trial: Trial, rate: float) -> Any:
    from sdcguard.inject.faults import Fault, FaultModel

    pattern = {"zero": "zero", "nan": "nan", "tile": "mix"}.get(trial.bits, "bitflip")
    bit = trial.bits if pattern == "bitflip" else None
    timing = {"one-off": "transient", "intermittent": "intermittent", "sticky": "sticky"}[trial.timing]
    return FaultModel(
        Fault(
            pattern=pattern,
            bit=bit,
            timing=timing,
            rate=rate if timing == "intermittent" else 1.0,
            seed=trial.seed,
            control=1.0 if trial.bits == "tile" else None,
        )
    )


class _CallCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        from sdcguard.inject.torch_faults import OP_FAMILIES

        self.families = {f: set(OP_FAMILIES[f]) for f in OP_TARGETS}
        self.n = dict.fromkeys(OP_TARGETS, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        target = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(target, torch.Tensor) and target.is_floating_point() and target.numel():
            for fam, names in self.families.items():
                if name in names:
                    self.n[fam] += 1
        return out


def count_op_calls(module: torch.nn.Module, loss_fn: Any, batch: Any) -> dict[str, dict[str, int]]:
    """Matching op calls per family in one forward and in its backward (a one-off fault picks one of them)."""
    params = [p for p in module.parameters() if p.requires_grad]
    state = torch.get_rng_state()
    with _CallCounter() as fwd:
        loss = loss_fn(module, batch)
    with _CallCounter() as bwd:
        torch.autograd.grad(loss, params, allow_unused=True)
    torch.set_rng_state(state)
    return {"forward": fwd.n, "backward": bwd.n}


class Injector:
    """One trial's fault on its rank (nothing elsewhere); counts what the fault model changed.

    ``original()`` wraps the step's own forward and backward, ``unit()`` everything the faulty unit computes in the
    step (the guard's replays and re-runs, a same-device re-run): a one-off op fault lives in the former only, an
    intermittent or sticky one in both."""

    def __init__(self, trial: Trial, rank: int, calls: dict[str, dict[str, int]] | None, *, rate: float) -> None:
        from sdcguard.inject.torch_faults import CorruptingCommHook, OpFaultMode

        self.trial = trial
        self.here = rank == trial.rank
        self.model = fault_model(trial, rate)
        self.records: list[Any] = []
        self.mode: Any = None
        self.comm_hook: Any = None
        if trial.op:
            occurrence = None
            if trial.timing == "one-off":
                assert calls is not None
                phases = ("forward", "backward") if trial.phase == "both" else (trial.phase,)
                n = sum(calls[p][trial.target] for p in phases)
                occurrence = random.Random(trial.seed).randrange(max(1, n))
            self.mode = OpFaultMode(
                self.model, ops=trial.target, phase=trial.phase, rank=trial.rank, occurrence=occurrence
            )
        elif trial.target == "collective":
            self.comm_hook = CorruptingCommHook(self.model, rank=trial.rank)

    def set_step(self, step: int) -> None:
        if self.mode is not None:
            self.mode.step = step
        if self.comm_hook is not None:
            self.comm_hook.step = step

    @contextlib.contextmanager
    def original(self) -> Iterator[None]:
        if self.mode is not None and self.trial.timing == "one-off":
            with self.mode:
                yield
        else:
            yield

    @contextlib.contextmanager
    def unit(self) -> Iterator[None]:
        if self.mode is not None and self.trial.timing != "one-off":
            with self.mode:
                yield
        else:
            yield

    def after_backward(self, module: torch.nn.Module, step: int) -> None:
        """A reduced-gradient fault: this rank's reduced gradients corrupted in memory after the reduction."""
        if self.here and self.trial.target == "reduced_grad":
            from sdcguard.inject.torch_faults import corrupt_gradients_

            self.records += corrupt_gradients_(module, self.model, rank=self.trial.rank, step=step)

    def after_optimizer(self, module: torch.nn.Module, step: int) -> None:
        """A weight fault: this rank's weights corrupted in memory after the optimizer step."""
        if self.here and self.trial.target == "weights":
            from sdcguard.inject.torch_faults import corrupt_weights_

            self.records += corrupt_weights_(module, self.model, rank=self.trial.rank, step=step)

    def changed(self) -> int:
        recs = list(self.records)
        for src in (self.mode, self.comm_hook):
            if src is not None:
                recs += src.records
        return sum(1 for r in recs if r.changed)
