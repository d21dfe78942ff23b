"""``benchmarks/replay_overhead.py --mesh`` (``tp``): the guard's share of a dense 2-D step: 4 ranks, ``dp=2 x tp=2``,
an MLP of ``--layers`` blocks (``ColwiseParallel`` then ``RowwiseParallel`` over ``tp``, FSDP2 over ``dp``),
configurations interleaved in rounds so machine noise hits each alike:

- ``2d``: the 2-D job without a guard; ``2d+checks``: ``SDCGuard(replay_every=0, checksum_every=0)``;
  ``2d+peer``: ``replay_every=10`` (another TP group replays a micro-batch together, each rank tracing what it puts
  into the TP collectives: :mod:`sdcguard.training.replay.collectives`); ``2d+untraced``: the same with the traces
  switched off, so ``2d+peer`` against it is what tracing costs.

Prints each configuration's median step time, its paired ratio to ``2d`` and the time inside the guard's calls on
rank 0 as a share of a ``2d`` step.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

from benchmarks.mesh_rounds import report, spawn


def _mesh_rank_main(rank: int, world: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    """The ``--mesh`` job: ``dp=2 x tp=2``, the same interleaved rounds, the time inside the guard's calls."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from sdcguard import SDCGuard

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    d, blocks = args.d, args.layers

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(*[nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(blocks)])
        plan = {f"{i}.0": ColwiseParallel() for i in range(blocks)} | {
            f"{i}.2": RowwiseParallel() for i in range(blocks)
        }
        parallelize_module(m, mesh["tp"], plan)
        for block in m:
            fully_shard(block, mesh=mesh["dp"])
        return fully_shard(m, mesh=mesh["dp"])

    def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).square().mean()

    dp_index = mesh.get_coordinate()[0]
    names = ["2d", "2d+checks", "2d+peer", "2d+untraced"]
    models = {n: fresh() for n in names}
    guards = {
        n: SDCGuard(models[n], loss_fn, replay_every=every, checksum_every=0)
        for n, every in (("2d+checks", 0), ("2d+peer", 10), ("2d+untraced", 10))
    }
    tracer = guards["2d+untraced"]._made.tracer  # the guard's own: switched off to measure what tracing costs
    assert tracer is not None, "a TP group traces its collectives"
    tracer.enabled = False
    opts = {n: torch.optim.SGD(m.parameters(), lr=1e-3) for n, m in models.items()}
    inside = {n: 0.0 for n in guards}
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in names:
            dist.barrier()
            t0 = time.perf_counter()
            for s in range(args.steps):
                x = torch.randn(args.batch * args.seq, d, generator=torch.Generator().manual_seed(s * 7 + dp_index))
                guard = guards.get(name)
                if guard is None:
                    loss_fn(models[name], x).backward()
                else:
                    guard.begin_step(r * args.steps + s)
                    guard.before_forward(x)
                    loss = loss_fn(models[name], x)
                    guard.observe_loss(loss)
                    loss.backward()
                    t1 = time.perf_counter()
                    if not guard.end_step().commit:
                        raise RuntimeError(f"{name}: unexpected veto")
                    if r:
                        inside[name] += time.perf_counter() - t1
                opts[name].step()
                opts[name].zero_grad(set_to_none=True)
            dist.barrier()
            if r:
                times[name].append((time.perf_counter() - t0) / args.steps)
    if rank == 0:
        queue.put((times, {n: v / (args.rounds * args.steps) for n, v in inside.items()}))
    dist.destroy_process_group()


def run(args: argparse.Namespace) -> None:
    """Run the four ranks and print the figures (see the module docstring)."""
    times, inside = spawn(_mesh_rank_main, args)
    title = (
        f"mesh: dp=2 x tp=2 (4 ranks), FSDP2 over dp, {args.layers} MLP blocks d={args.d} -> {4 * args.d}, "
        f"{args.batch * args.seq} rows, threads/process={args.threads}, {args.rounds} rounds x {args.steps} steps"
    )
    report(title, times, inside, "2d")
