# torchrun --standalone --nproc-per-node 4 examples/moe_ep.py
"""The guard on a mixture-of-experts job with expert parallelism: a ``(dp=2, ep=2)`` mesh, four experts sharded
over ``ep`` (each rank holds two, as a ``DTensor``), top-2 routing, tokens sent to their expert's rank and back by
``all_to_all_single`` (``sdcguard.testing.moe``). Every rank reads its own micro-batch; the loop reduces the
gradients itself, dense ones over every rank and each expert's over the ranks holding it (torchtitan's and
Megatron's rule), and makes the guard's four calls around its forward and backward.

What the guard does with the ``ep`` dimension: dense parameters are compared over every data rank, expert
parameters over their expert-data-parallel replicas (the ranks with the same ``ep`` coordinate); a sampled step is
replayed by another EP group together, its all-to-alls included; every rank's own shards are checked against what
the optimizer step wrote. CPU and gloo (the dispatch sizes travel through the host).
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import sdcguard
from sdcguard.testing.moe import MoE, moe_batch, moe_loss, reduce_moe_gradients

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "ep"))
torch.manual_seed(0)
model = MoE(experts=4, top_k=2, ep_mesh=mesh["ep"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = sdcguard.SDCGuard(model, moe_loss, mesh=mesh, replay_every=4)
committed = 0
for step in range(12):
    batch = moe_batch(step, rank)
    guard.begin_step(step)
    guard.before_forward(batch)
    loss = moe_loss(model, batch)
    guard.observe_loss(loss)
    loss.backward()
    reduce_moe_gradients(model, None, mesh["dp"].get_group(), world)
    report = guard.end_step(loss=loss.detach())
    if report.commit:
        optimizer.step()
        committed += 1
    optimizer.zero_grad()
    guard.after_optimizer_step()
guard.close()
dp, ep = mesh.get_coordinate()
print(f"rank {rank} (dp {dp}, ep {ep}): {committed} of 12 steps committed, {len(guard.incidents)} incidents")
dist.destroy_process_group()
