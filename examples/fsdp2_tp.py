# torchrun --standalone --nproc-per-node 4 examples/fsdp2_tp.py
"""The guard on a 2-D mesh, torchtitan's recipe: tensor parallelism over ``tp`` (``ColwiseParallel`` then
``RowwiseParallel``) and FSDP2 over ``dp``. The same two calls as under DDP; the guard reads the mesh from the
parameters' DTensors.

What it does with the mesh: every rank fingerprints its own shard; a sampled micro-batch of one TP group is replayed
by another TP group together (their TP collectives and FSDP all-gathers included), each rank comparing its local
gradients with those of the rank holding the same shard; a fault in one rank's shard names that rank (with a third
replica of each shard), one that crossed the TP collectives is one ``unresolved`` incident naming its TP group; every
step is committed or vetoed by every rank of the mesh alike. With ``dp=2`` (this example) each shard has two
replicas: an incident holds the faulty rank among its suspects.
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import sdcguard

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
if cuda:
    torch.cuda.set_device(device)
mesh = init_device_mesh(device.type, (world // 2, 2), mesh_dim_names=("dp", "tp"))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.head = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.nn.functional.gelu(self.up(x))))


torch.manual_seed(0)
model = MLP().to(device)
parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


guard = sdcguard.SDCGuard(model, loss_fn, replay_every=4)
data = torch.Generator().manual_seed(mesh.get_coordinate()[0])  # the ranks of one TP group read one micro-batch
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
dp, tp = mesh.get_coordinate()
print(f"rank {rank} (dp {dp}, tp {tp}): {committed} of 12 steps committed, {len(guard.incidents)} incidents")
dist.destroy_process_group()
