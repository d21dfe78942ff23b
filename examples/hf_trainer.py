# torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py
"""The guard in a Hugging Face ``Trainer``: one callback; the ``Trainer`` runs DDP through Accelerate.

The model computes its own loss (the ``Trainer`` passes ``labels``) and returns it as the ``Trainer`` accepts it:
a ``ModelOutput``, a plain ``dict`` (as here) or a tuple whose first element is the loss. The callback records the
model's training forwards (its keyword inputs and the loss the backward starts from) and ends each guarded step in
``on_pre_optimizer_step`` (gradients accumulated and clipped). Nothing is downloaded: the model is defined here.
"""

import tempfile
import warnings

import torch
import transformers

from sdcguard.adapters.hf import SDCGuardTrainerCallback

warnings.filterwarnings("ignore", ".*torch.distributed.*")


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        prediction = self.net(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(prediction, labels), "prediction": prediction}


torch.manual_seed(0)
rows = [{"x": torch.randn(32), "labels": torch.randn(())} for _ in range(256)]
guard_cb = SDCGuardTrainerCallback(replay_every=5)
args = transformers.TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="sdcguard-hf-"),
    max_steps=15,
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    use_cpu=not torch.cuda.is_available(),
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    disable_tqdm=True,
    ddp_find_unused_parameters=False,
)
trainer = transformers.Trainer(model=Regressor(), args=args, train_dataset=rows, callbacks=[guard_cb])
trainer.train()
guard = guard_cb.guard
assert guard is not None
print(
    f"rank {args.process_index}: {trainer.state.global_step} steps, {len(guard.incidents)} incidents, "
    f"last verified step {guard.last_verified_step}"
)
if torch.distributed.is_initialized():  # the Trainer made the group: end it before exit (a live gloo group's threads
    torch.distributed.destroy_process_group()  # at interpreter shutdown once aborted rank 1 with SIGABRT)
