# torchrun --standalone --nproc-per-node 2 examples/lightning_ddp.py
"""The guard in a Lightning ``Trainer``: one callback, ``strategy="ddp"`` (FSDP2: ``ModelParallelStrategy``).

The callback wraps the module's ``training_step`` for the run and ends each guarded step in
``on_before_optimizer_step`` (gradients accumulated and unscaled, not yet clipped): a replay recomputes the
micro-batch through your ``training_step`` with ``self.log`` silenced. Lightning finds torchrun's environment and
joins its process group; ``devices`` must match ``--nproc-per-node``.
"""

import os
import warnings

import lightning.pytorch as L
import torch

from sdcguard.adapters.lightning import SDCGuardCallback

warnings.filterwarnings("ignore", ".*does not have many workers.*")  # a tiny in-memory dataset


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
guard_cb = SDCGuardCallback(replay_every=5)
trainer = L.Trainer(
    max_steps=15,
    accelerator="cpu",  # accelerator="gpu" on GPUs
    devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
    strategy="ddp",
    callbacks=[guard_cb],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Classifier(), torch.utils.data.DataLoader(data, batch_size=16))
guard = guard_cb.guard
assert guard is not None
print(
    f"rank {trainer.global_rank}: {trainer.global_step} steps, {len(guard.incidents)} incidents, "
    f"last verified step {guard.last_verified_step}"
)
