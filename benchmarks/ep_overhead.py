"""``benchmarks/replay_overhead.py --mesh ep``: the guard's share of an expert-parallel step, measured as the dense
2-D figure (``--mesh``) is: 4 ranks, ``dp=2 x ep=2``, :class:`sdcguard.testing.moe.MoE` (``--d`` wide, experts
``4 * d`` wide, 4 experts, top-2, ``all_to_all_single`` dispatch and combine), the loop's own gradient reduction,
configurations interleaved in rounds so machine noise hits each alike:

- ``ep``: the job without a guard; ``ep+checks``: ``SDCGuard(replay_every=0, checksum_every=0)`` (the every-step
  checks: cross-replica, memory, non-finite); ``ep+peer``: ``replay_every=10`` (another EP group replays a
  micro-batch together, its all-to-alls included).

Prints each configuration's median step time, its paired ratio to ``ep`` and the time inside the guard's calls on
rank 0 as a share of an ``ep`` step.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

from benchmarks.mesh_rounds import report, spawn


def _ep_rank_main(rank: int, world: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from sdcguard import SDCGuard
    from sdcguard.testing.moe import MoE, moe_batch, moe_loss, reduce_moe_gradients

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    names = ["ep", "ep+checks", "ep+peer"]

    def fresh() -> Any:
        torch.manual_seed(0)
        return MoE(experts=4, top_k=2, ep_mesh=mesh["ep"], d=args.d, hidden=4 * args.d)

    models = {n: fresh() for n in names}
    guards = {
        n: SDCGuard(models[n], moe_loss, mesh=mesh, replay_every=every, checksum_every=0)
        for n, every in (("ep+checks", 0), ("ep+peer", 10))
    }
    opts = {n: torch.optim.SGD(m.parameters(), lr=1e-3) for n, m in models.items()}
    inside = {n: 0.0 for n in guards}
    times: dict[str, list[float]] = {n: [] for n in names}
    dp_group = mesh["dp"].get_group()
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in names:
            dist.barrier()
            t0 = time.perf_counter()
            for s in range(args.steps):
                step = r * args.steps + s
                batch = moe_batch(step, rank, rows=args.batch * args.seq)
                guard = guards.get(name)
                if guard is not None:
                    guard.begin_step(step)
                    guard.before_forward(batch)
                loss = moe_loss(models[name], batch)
                if guard is not None:
                    guard.observe_loss(loss)
                loss.backward()
                reduce_moe_gradients(models[name], None, dp_group, world)
                if guard is not None:
                    t1 = time.perf_counter()
                    if not guard.end_step().commit:
                        raise RuntimeError(f"{name}: unexpected veto")
                    if r:
                        inside[name] += time.perf_counter() - t1
                opts[name].step()
                opts[name].zero_grad(set_to_none=True)
                if guard is not None:
                    t2 = time.perf_counter()
                    guard.after_optimizer_step()
                    if r:
                        inside[name] += time.perf_counter() - t2
            dist.barrier()
            if r:
                times[name].append((time.perf_counter() - t0) / args.steps)
    if rank == 0:
        queue.put((times, {n: v / (args.rounds * args.steps) for n, v in inside.items()}))
    dist.destroy_process_group()


def run(args: argparse.Namespace) -> None:
    """Run the four ranks and print the figures (see the module docstring)."""
    times, inside = spawn(_ep_rank_main, args)
    title = (
        f"mesh: dp=2 x ep=2 (4 ranks), MoE d={args.d}, 4 experts of width {4 * args.d}, top-2, "
        f"{args.batch * args.seq} tokens per rank, threads/process={args.threads}, {args.rounds} rounds x "
        f"{args.steps} steps"
    )
    report(title, times, inside, "ep")
