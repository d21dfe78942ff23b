"""Lightning's ``ModelParallelStrategy`` with tensor parallelism (4 processes: ``data_parallel=2 x
tensor_parallel=2``, FSDP2 over ``data_parallel``): the callback reads the strategy's device mesh from the model's
``DTensor`` parameters, so clean steps commit with no incident, and a fault in one TP rank's weight gradient is
vetoed on every rank at its step with that rank among the suspects (two replicas of each shard: ``unresolved``)."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import pytest
import torch

from sdcguard.testing import run_ranks
from tests._tensor_parallel import D, H, ShapeFault, TPNet, loss_fn, make_batch

pytestmark = pytest.mark.distributed
STEPS, AT, FAULTY = 4, 2, 1


def _job(rank: int, world: int, faulty: bool) -> dict[str, Any]:
    import lightning.pytorch as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    from sdcguard.adapters.lightning import SDCGuardCallback

    warnings.filterwarnings("ignore")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # the process group exists already; Lightning reuses it

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = TPNet()

        def configure_model(self) -> None:
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            tp, dp = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
            parallelize_module(self.net, tp, {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(self, mesh=dp)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return loss_fn(self, batch)  # through the root module: FSDP2's hooks are on it

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    mode = ShapeFault((D, H // 2), FAULTY, AT, None) if faulty else None

    class Probe(L.Callback):
        def __init__(self, cb: SDCGuardCallback) -> None:
            self.cb, self.steps = cb, []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            if mode is not None:
                mode.step = trainer.global_step

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
            r = self.cb.last_report
            self.steps.append((r.step, r.commit, [(i.kind, tuple(i.suspect_ranks)) for i in r.incidents]))

    cb = SDCGuardCallback(replay_every=1, weight_check_every=1, escalate="off", checksum_every=0)
    probe = Probe(cb)
    trainer = L.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=world,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2), logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[cb, probe],
    )  # fmt: skip
    data = [make_batch(s, rank // 2) for s in range(STEPS)]  # both ranks of a TP group read one micro-batch
    with mode if mode is not None else contextlib.nullcontext():
        trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))
    return {"steps": probe.steps}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("faulty", [False, True])
def test_lightning_tensor_parallel_commits_clean_steps_and_vetoes_a_fault_everywhere(faulty: bool) -> None:
    pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    results = run_ranks(_job, 4, faulty, timeout=280)
    steps = results[0]["steps"]
    assert all(r["steps"] == steps for r in results), "every rank decided alike"
    assert [s for s, _, _ in steps] == list(range(STEPS))
    for step, commit, incidents in steps:
        if faulty and step == AT:
            assert not commit and incidents and all(FAULTY in s for _, s in incidents), incidents
        else:
            assert commit and incidents == [], (step, incidents)
