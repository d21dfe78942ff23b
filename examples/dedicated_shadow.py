# torchrun --standalone --nproc-per-node 3 examples/dedicated_shadow.py
"""Dedicated shadows: a hot spare replays the workers' sampled micro-batches while they go on training.

The last rank is the shadow (``plan_roles(num_shadows=1)``, collective); the two workers train under DDP over their
own group. On each sampled step a worker sends its micro-batch, random states and parameters to the shadow from a
staging copy, and picks up the shadow's verdict at a later step (a shadow's incident names an earlier step: use
``on_detect="raise"`` or ``"exit"`` and restart from a checkpoint older than it). Not with FSDP2: a shadow replays
a whole model on one device.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sdcguard

dist.init_process_group("gloo")  # "nccl" on GPUs
roles = sdcguard.plan_roles(num_shadows=1)  # the last rank replays; collective
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


guard = sdcguard.SDCGuard(
    DDP(model, process_group=roles.dp_group) if roles.role == "worker" else model,
    loss_fn,
    group=roles.dp_group,
    shadows=list(roles.shadows),
    replay_every=2,
)
if roles.role == "shadow":
    replayed = guard.serve()  # until every worker calls guard.close()
    print(f"rank {dist.get_rank()}: shadow, replayed {replayed} samples")
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(dist.get_rank())
    for step in range(10):
        batch = (torch.randn(16, 32, generator=data), torch.randint(0, 4, (16,), generator=data))
        if guard.step(step, batch).commit:
            optimizer.step()
        optimizer.zero_grad()
        guard.after_optimizer_step()
    guard.close()
    print(f"rank {dist.get_rank()}: worker, 10 steps, {len(guard.incidents)} incidents")
dist.destroy_process_group()
