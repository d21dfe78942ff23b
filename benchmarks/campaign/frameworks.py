"""The real entry points: one-off faults inside the framework's own backward, through the Lightning callback (DDP) and
on an FSDP2 model (``fully_shard``), 3 ranks each, ``replay_every=1`` (every step sampled: what the guard sees on a
sampled step).

The guard only observes here: Lightning runs its own forward, backward and reduction (``SDCGuardCallback``), and the
FSDP2 loop is the raw one (the guard's four calls around the framework's own backward and reduce-scatter). An
``OpFaultMode`` with ``phase="backward"`` is entered just for the backward (Lightning's ``on_before_backward`` /
``on_after_backward``), so the fault lands in the framework's own backward and nowhere else.

Whether a fault changed the faulty rank's local gradients is decided on a *twin*: an unsharded, unwrapped copy of
the model at the same weights, run on the faulty rank with the same batch, random state and fault (same seed, same
op call), once clean and once faulty. The twin's corrupted element is checked against the job's own fault record
(``twin_matched``), so the verdict is about the very corruption the job saw.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .baselines import all_bits_equal
from .faults import Trial, count_op_calls, fault_model

MODEL = {"d": 16, "heads": 2, "layers": 2, "seq": 8, "p": 0.1}
BATCH = 4


@dataclass(frozen=True, kw_only=True)
class FrameworkPlan:
    trials: tuple[Trial, ...]
    clean_steps: int = 3


def _occurrence(trial: Trial, calls: dict[str, dict[str, int]]) -> int:
    import random

    return random.Random(trial.seed).randrange(max(1, calls["backward"][trial.target]))


def _mode(trial: Trial, calls: Any, *, rank: int | None) -> Any:
    from sdcguard.inject.torch_faults import OpFaultMode

    return OpFaultMode(
        fault_model(trial, 1.0), ops=trial.target, phase="backward", rank=rank, occurrence=_occurrence(trial, calls)
    )


def _twin(twin: torch.nn.Module, trial: Trial, calls: Any, batch: Any, rng: torch.Tensor) -> tuple[bool, Any]:
    """(did the fault change the local gradients, the twin's fault records); the random stream is put back."""
    from sdcguard.testing.models import lm_loss

    params = [p for p in twin.parameters() if p.requires_grad]
    saved = torch.get_rng_state()
    torch.set_rng_state(rng)
    clean = torch.autograd.grad(lm_loss(twin, batch), params, allow_unused=True)
    torch.set_rng_state(rng)
    mode = _mode(trial, calls, rank=None)
    loss = lm_loss(twin, batch)
    with mode:
        faulty = torch.autograd.grad(loss, params, allow_unused=True)
    torch.set_rng_state(saved)
    return not all_bits_equal(list(clean), list(faulty)), [(r.target, r.index, r.before, r.after) for r in mode.records]


def _records(mode: Any) -> list[Any]:
    return [(r.target, r.index, r.before, r.after) for r in mode.records]


def _result(trial: Trial, rank: int, report: Any, mode: Any, twin: tuple[bool, Any] | None) -> dict[str, Any]:
    out = {"commit": report.commit, "incidents": [(i.kind, list(i.suspect_ranks)) for i in report.incidents]}
    if rank == trial.rank:
        assert twin is not None
        out |= {
            "effective": twin[0],
            "changed": sum(1 for r in mode.records if r.changed),
            "twin_matched": twin[1] == _records(mode) and bool(twin[1]),
        }
    return out


def fsdp_main(rank: int, world: int, plan: FrameworkPlan) -> dict[str, Any]:
    """The raw FSDP2 loop (``fully_shard`` on each block and the root), the guard's four calls around it."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sdcguard import SDCGuard
    from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

    torch.manual_seed(0)
    model = TinyTransformer(**MODEL)
    twin = copy.deepcopy(model)
    calls = count_op_calls(twin, lm_loss, make_batch(0, rank, batch=BATCH, seq=MODEL["seq"]))
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    guard = SDCGuard(
        model, lm_loss, replay_every=1, weight_check_every=1, escalate="off", checksum_every=0, slow=None
    )  # one long run; replay measured alone here; no slow-rank timing (the machine's load, not a fault)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shards = [p.to_local().detach().clone() for p in model.parameters()]
    out: list[dict[str, Any]] = []
    for i in range(plan.clean_steps + len(plan.trials)):
        trial = plan.trials[i - plan.clean_steps] if i >= plan.clean_steps else None
        if trial is not None:  # the weights are restored per trial; the guard's state is not (one long run)
            with torch.no_grad():
                for p, s in zip(model.parameters(), shards):
                    p.to_local().copy_(s)
            guard.after_optimizer_step()  # a write of the weights: the memory check's new reference, not a fault
        torch.manual_seed(60_000 + 7 * i + rank)
        batch = make_batch(i, rank, batch=BATCH, seq=MODEL["seq"])
        rng = torch.get_rng_state()
        twin_result = _twin(twin, trial, calls, batch, rng) if trial is not None and rank == trial.rank else None
        mode = _mode(trial, calls, rank=trial.rank) if trial is not None else None
        guard.begin_step(i)
        guard.before_forward(batch)
        loss = lm_loss(model, batch)
        guard.observe_loss(loss)
        with mode if mode is not None else nullcontext():
            loss.backward()  # FSDP2's own backward and reduce-scatter
        report = guard.end_step(loss=loss.detach())
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        guard.after_optimizer_step()
        if trial is not None:
            out.append(_result(trial, rank, report, mode, twin_result))
        elif report.incidents:
            out.append({"clean_incident": [(x.kind, list(x.suspect_ranks)) for x in report.incidents]})
    guard.close()
    return {"rank": rank, "results": out}


def lightning_main(rank: int, world: int, plan: FrameworkPlan) -> dict[str, Any]:
    """``SDCGuardCallback`` on a Lightning ``Trainer`` with ``DDPStrategy`` (the process group exists already)."""
    import os

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import lightning.pytorch as L
    from lightning.pytorch.strategies import DDPStrategy

    from sdcguard.adapters.lightning import SDCGuardCallback
    from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = TinyTransformer(**MODEL)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.net(tokens)

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return lm_loss(self, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    module = Module()
    twin = copy.deepcopy(module.net)
    snapshot = [p.detach().clone() for p in module.net.parameters()]
    calls = count_op_calls(twin, lm_loss, make_batch(0, rank, batch=BATCH, seq=MODEL["seq"]))
    cb = SDCGuardCallback(
        replay_every=1, weight_check_every=1, escalate="off", checksum_every=0, slow=None
    )  # one long run; replay measured alone here; no slow-rank timing
    probe = _LightningProbe(cb, plan, rank, calls, twin, snapshot, L.Callback)
    steps = plan.clean_steps + len(plan.trials)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=world,
        strategy=DDPStrategy(),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb, probe.callback],
    )
    data = [make_batch(s, rank, batch=BATCH, seq=MODEL["seq"]) for s in range(steps)]
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    return {"rank": rank, "results": probe.results}


class _LightningProbe:
    """Restores the weights and the guard's state before each trial, seeds the step, computes the twin, and puts the
    fault around Lightning's own backward."""

    def __init__(
        self, cb: Any, plan: FrameworkPlan, rank: int, calls: Any, twin: Any, snapshot: Any, base: type
    ) -> None:
        self.cb, self.plan, self.rank, self.calls, self.twin, self.snapshot = cb, plan, rank, calls, twin, snapshot
        self.results: list[dict[str, Any]] = []
        self.mode: Any = None
        self.twin_result: Any = None
        probe = self

        class Callback(base):
            def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
                probe.start(trainer.global_step, pl_module, batch)

            def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
                if probe.mode is not None:
                    probe.mode.__enter__()

            def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
                if probe.mode is not None:
                    probe.mode.__exit__(None, None, None)

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
                probe.end()

        self.callback = Callback()

    def trial(self, step: int) -> Trial | None:
        k = step - self.plan.clean_steps
        return self.plan.trials[k] if 0 <= k < len(self.plan.trials) else None

    def start(self, step: int, pl_module: Any, batch: Any) -> None:
        trial = self.trial(step)
        self.mode, self.twin_result = None, None
        if trial is not None:
            with torch.no_grad():
                for p, s in zip(pl_module.net.parameters(), self.snapshot):
                    p.copy_(s)
            if self.cb.guard is not None:  # a write of the weights: the memory check's new reference, not a fault
                self.cb.guard.after_optimizer_step()
        torch.manual_seed(70_000 + 7 * step + self.rank)
        if trial is not None:
            if self.rank == trial.rank:
                self.twin_result = _twin(self.twin, trial, self.calls, batch, torch.get_rng_state())
            self.mode = _mode(trial, self.calls, rank=trial.rank)

    def end(self) -> None:
        report = self.cb.last_report
        trial = self.trial(report.step)
        if trial is not None:
            self.results.append(_result(trial, self.rank, report, self.mode, self.twin_result))
        elif report.incidents:
            self.results.append({"clean_incident": [(x.kind, list(x.suspect_ranks)) for x in report.incidents]})
