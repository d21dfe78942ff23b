"""A Hugging Face ``Trainer`` callback for the tests and the GPU check, run after the guard's callback: it keeps a
fault injector's step in step with the Trainer's and records, for each optimizer step, what the guard decided
and whether the step moved any weight (a vetoed step must not; a committed one does)."""

from __future__ import annotations

from typing import Any

__all__ = ["StepRecord", "hf_step_probe"]

StepRecord = tuple[int, bool, bool, list[tuple[str, tuple[int, ...]]]]
"""``(step, committed, weights changed, [(incident kind, suspect ranks), ...])`` of one optimizer step."""


def hf_step_probe(cb: Any, mode: Any = None) -> Any:
    """A ``transformers.TrainerCallback`` whose ``steps`` list gains a :data:`StepRecord` per optimizer step of
    ``cb`` (an ``SDCGuardTrainerCallback``); ``mode``: a fault injector whose ``step`` follows the Trainer's global
    step. Weights are compared shard by shard where they are sharded (an FSDP2 ``DTensor``'s local tensor)."""
    import torch
    import transformers

    from ..fingerprints.tensors import local_tensor as local

    class Probe(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[StepRecord] = []
            self.before: list[torch.Tensor] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if mode is not None:
                mode.step = state.global_step

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            self.before = [local(p).clone() for p in model.parameters()]

        def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            r = cb.last_report
            changed = any(not torch.equal(b, local(p)) for b, p in zip(self.before, model.parameters()))
            self.steps.append((r.step, r.commit, changed, [(i.kind, i.suspect_ranks) for i in r.incidents]))

    return Probe()
