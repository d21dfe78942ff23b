"""The Lightning and Hugging Face adapters on real multi-process jobs (skipped, with the reason, without the
framework): the guard observes the step the framework runs, so a one-off fault inside the framework's own forward
on one rank is named at that step and no rank applies it; clean steps commit and train.

Each framework runs inside the test harness's gloo process group (3 processes on the CPU), the way ``torchrun``
starts it: Lightning's DDP and FSDP2 (``ModelParallelStrategy``), bf16 autocast and gradient accumulation; the HF
``Trainer`` through Accelerate's DDP.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch

from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing import run_ranks
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

pytestmark = pytest.mark.distributed
STEPS = 6
FAULT_STEP, FAULT_RANK = 2, 1


def _fault() -> OpFaultMode:
    return OpFaultMode(
        Fault(pattern="bitflip", bit="exponent", timing="transient", seed=1),
        ops="gelu",
        phase="forward",
        rank=FAULT_RANK,
        steps=[FAULT_STEP],
    )


def _lightning(rank: int, world: int, strategy: str, precision: str, accumulate: int) -> Any:
    import lightning.pytorch as L

    from sdcguard.adapters.lightning import SDCGuardCallback

    warnings.filterwarnings("ignore")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # the process group exists already; Lightning reuses it

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = TinyTransformer(d=8, heads=2, seq=4, layers=2)

        def configure_model(self) -> None:
            if strategy == "fsdp":
                from torch.distributed.fsdp import fully_shard

                mesh = self.device_mesh["data_parallel"]
                for block in self.net.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(self, mesh=mesh)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.net(tokens)

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = lm_loss(self, batch)
            self.log("loss", loss)  # replays must not reach the logs (nor fail on them)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    mode = _fault()

    class Probe(L.Callback):
        """After the guard's callback: did each optimizer step move the weights, and did the guard commit it?"""

        def __init__(self, cb: SDCGuardCallback) -> None:
            self.cb, self.steps, self.before = cb, [], []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            mode.step = trainer.global_step

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            self.before = [p.detach().clone() for p in pl_module.parameters()]

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
            if (idx + 1) % accumulate:
                return
            r = self.cb.last_report
            changed = any(not torch.equal(b, p) for b, p in zip(self.before, pl_module.parameters()))
            self.steps.append((r.step, r.commit, changed, [(i.kind, i.suspect_ranks) for i in r.incidents]))

    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    strat = (
        DDPStrategy() if strategy == "ddp" else ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)
    )
    cb = SDCGuardCallback(replay_every=1, weight_check_every=1)
    probe = Probe(cb)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=world,
        strategy=strat,
        precision=precision,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb, probe],
    )
    data = [make_batch(s, rank, seq=4) for s in range(STEPS * accumulate)]
    with mode:
        trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))
    assert cb.guard is not None
    return {"steps": probe.steps, "changed": len(mode.records), "samples": cb.state_dict()["samples"]}


def _expect(results: list[dict[str, Any]]) -> None:
    assert results[FAULT_RANK]["changed"] >= 1, "the injector changed nothing"
    for res in results:
        assert res["samples"] == STEPS  # every step was a sampled (replayed) step
        for step, commit, changed, incidents in res["steps"]:
            if step == FAULT_STEP:
                assert incidents == [("replay", (FAULT_RANK,))] and not commit and not changed  # not applied
            else:
                assert incidents == [] and commit and changed, (step, incidents)  # checked, committed, applied
    assert results[0]["steps"] == results[1]["steps"] == results[2]["steps"]


@pytest.mark.slow
@pytest.mark.timeout(280)
@pytest.mark.parametrize(
    ("strategy", "precision", "accumulate"),
    [
        ("ddp", "32-true", 1),
        ("ddp", "bf16-mixed", 2),  # autocast captured inside the framework's forward; one of two micro-batches replayed
        ("fsdp", "32-true", 1),  # FSDP2 through Lightning's ModelParallelStrategy
    ],
)
def test_lightning_one_off_fault_in_the_framework_forward_is_named_and_not_applied(
    strategy: str, precision: str, accumulate: int
) -> None:
    pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    _expect(run_ranks(_lightning, 3, strategy, precision, accumulate, timeout=260))


def _hf(rank: int, world: int, out_dir: str) -> Any:
    import transformers

    from sdcguard.adapters.hf import SDCGuardTrainerCallback
    from sdcguard.testing.hf import hf_step_probe

    warnings.filterwarnings("ignore")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    # activation "gelu": GPT-2's default "gelu_new" is a tanh composite with no aten gelu op to corrupt. Dropout
    # stays on (GPT-2's 0.1): the replays must reproduce the Trainer's random state.
    config = transformers.GPT2Config(
        vocab_size=61,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        activation_function="gelu",
        bos_token_id=0,
        eos_token_id=0,
    )
    rows = [
        {"input_ids": make_batch(s, rank)["tokens"][0], "labels": make_batch(s, rank)["tokens"][0]}
        for s in range(2 * STEPS * 2)
    ]
    mode = _fault()

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    cb = SDCGuardTrainerCallback(replay_every=1, weight_check_every=1)
    probe = hf_step_probe(cb, mode)
    args = transformers.TrainingArguments(
        output_dir=out_dir,
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb, probe])
    with mode:
        trainer.train()
    assert cb.guard is not None
    return {
        "steps": probe.steps,
        "changed": len(mode.records),
        "samples": cb.guard.state_dict()["samples"],
        "ddp": type(trainer.model_wrapped).__name__,
    }


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_hf_trainer_with_ddp_one_off_fault_is_named_and_not_applied(tmp_path: Any) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate (the Trainer needs it) is not installed")
    results = run_ranks(_hf, 3, str(tmp_path), timeout=260)
    assert {r["ddp"] for r in results} == {"DistributedDataParallel"}
    _expect(results)
