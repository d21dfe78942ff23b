# torchrun --standalone --nproc-per-node 2 examples/ddp_loop.py
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sdcguard

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, cuda = dist.get_rank(), torch.cuda.is_available()
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
torch.manual_seed(0)  # the same initial weights on every rank
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)).to(device)
model, optimizer = DDP(net), torch.optim.SGD(net.parameters(), lr=0.1)


def loss_fn(model, batch):  # the guard runs it for the step, and for a replay of it on another rank
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


guard = sdcguard.SDCGuard(model, loss_fn, replay_every=5, store="sdcguard-job.db")  # rank 0 records incidents
data = torch.Generator().manual_seed(rank)  # each rank its own batches
for step in range(20):
    batch = (torch.randn(16, 32, generator=data).to(device), torch.randint(0, 4, (16,), generator=data).to(device))
    report = guard.step(step, batch)  # forward, backward, the checks; report.commit is the same on every rank
    if report.commit:
        optimizer.step()
    optimizer.zero_grad()
    guard.after_optimizer_step()  # the cross-replica weight check, on its schedule
guard.close()
print(f"rank {rank}: 20 steps, {len(guard.incidents)} incidents, last verified step {guard.last_verified_step}")
dist.destroy_process_group()
