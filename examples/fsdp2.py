# torchrun --standalone --nproc-per-node 2 examples/fsdp2.py
"""The guard on an FSDP2 model (``fully_shard``): the same two calls as under DDP.

Each block is sharded across the ranks (one mesh dimension); every rank replays a peer's micro-batch through the
sharded module on sampled steps, and its reduce-scatter inputs are the local gradients compared. With FSDP2 every
shard exists once, so there is nothing to compare across replicas on the other steps; HSDP (a ``replicate`` and a
``shard`` dimension, ``init_device_mesh(..., (2, n // 2), mesh_dim_names=("replicate", "shard"))``) compares each
shard's replicas every step.
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import sdcguard

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
if cuda:
    torch.cuda.set_device(device)
torch.manual_seed(0)
blocks = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)]
model = torch.nn.Sequential(*blocks, torch.nn.Linear(32, 4)).to(device)
mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
for block in blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


guard = sdcguard.SDCGuard(model, loss_fn, replay_every=4)
data = torch.Generator().manual_seed(rank)
committed = 0
for step in range(12):
    batch = (torch.randn(8, 32, generator=data).to(device), torch.randint(0, 4, (8,), generator=data).to(device))
    report = guard.step(step, batch)
    if report.commit:
        optimizer.step()
        committed += 1
    optimizer.zero_grad()
    guard.after_optimizer_step()
guard.close()
print(f"rank {rank}: FSDP2 over {world} ranks, {committed} of 12 steps committed, {len(guard.incidents)} incidents")
dist.destroy_process_group()
