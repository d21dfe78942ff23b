"""What the training guard costs the workers, side by side in one run, interleaved in rounds so machine noise hits
every configuration alike (paired medians per round, with the interquartile range).

Two jobs' worth of configurations, each on its own copy of the model, in the same processes:

``compute`` (a transformer, d=256, 4 layers, 128 tokens; ~0.5 s steps here):

- ``plain``: DDP forward + backward + SGD step, no guard (the baseline);
- ``fwd+bwd``: forward and backward alone, no communication (the unit of the peer-mode goal);
- ``checks``: ``SDCGuard(replay_every=0)``: every-step cross-replica checks only;
- ``nopath``: ``checks`` without the check of the gradients' path into DDP's reduction
  (:mod:`sdcguard.training.hooks.bucket`, switched off through ``guard.taps.reduction.enabled``): ``checks`` against
  it is what that check costs;
- ``peer``: ``SDCGuard(replay_every=10)``: a peer replays one step in ten;
- ``hooks``: the same as ``peer``, driven the way the Lightning and Hugging Face callbacks drive it (the framework's
  own loop calls ``begin_step``, ``before_forward``, ``observe_loss``, its backward, ``end_step``);
- ``shadow``: ``SDCGuard(replay_every=10, shadows=[last rank])``, the shadow replaying while workers go on;
- ``fsdp`` / ``fsdp+peer``: the same model sharded with FSDP2 (per block), without and with ``replay_every=10``;
- ``sum1`` / ``sumdefault``: ``SDCGuard(replay_every=0, checksum_every=1 | DEFAULT_CHECKSUM_EVERY)``: the matmul
  checksum checks on every step (the cost of a checked step) and at the default (one step in 4), against ``checks``
  (the same guard without them);
- ``defaults``: ``SDCGuard()`` at its defaults (``replay_every=50``, ``checksum_every=4``).

Every other guard configuration runs with ``checksum_every=0``, so each check's cost stands apart.

``mesh`` (``--mesh``; 4 ranks, ``dp=2 x tp=2``, FSDP2 over ``dp``: :mod:`benchmarks.tp_overhead`): ``2d``,
``2d+checks``, ``2d+peer`` and ``2d+untraced`` (the peer without the traces of the TP collectives), beside each other.

``ep`` (``--mesh ep``; 4 ranks, ``dp=2 x ep=2``, a mixture of experts with an all-to-all dispatch:
:mod:`benchmarks.ep_overhead`): ``ep``, ``ep+checks``, ``ep+peer``, the same three beside each other.

``comm`` (``--comm``; a wide MLP with a small batch, whose gradient all-reduce is a large share of the step):

- ``plain``: DDP, whose all-reduce overlaps the backward;
- ``checks``: the guard's every-step checks on the same DDP model (overlap kept: within noise of ``plain``);
- ``nopath``: as above, without the check of the gradients' path into the reduction;
- ``post``: the guard's former design, kept here as a baseline: local gradients computed into fresh tensors, then
  a bucketed all-reduce after the whole backward (the communication no longer overlaps).

Besides step times it prints the time spent inside the guard's own calls on worker 0 (``end_step`` and
``after_optimizer_step``: checks, replays, exchanges, verdicts), which does not depend on comparing noisy steps. Run::

    python benchmarks/replay_overhead.py [--workers 2] [--rounds 8] [--steps 10] [--comm | --mesh [tp|ep]]
                                         [--only NAME ...]

On a machine with fewer cores than processes the shadow competes with the workers for CPU (it runs at the lowest
priority here); on a real cluster it has its own device, and NCCL's latency is tens of microseconds where gloo's is
1-2 ms on this VM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sdcguard.training.config import DEFAULT_CHECKSUM_EVERY  # noqa: E402

LABELS = {
    "plain": "no guard (DDP)",
    "fwd+bwd": "forward+backward only",
    "checks": "guard, replay off",
    "nopath": "guard, replay off, no path check",
    "peer": "guard, peer, replay_every=10",
    "hooks": "guard via framework hooks (adapters)",
    "shadow": "guard, dedicated shadow",
    "fsdp": "FSDP2, no guard",
    "fsdp+peer": "FSDP2, guard, replay_every=10",
    "post": "reduction after the backward (old)",
    "sum1": "guard, checksums every step",
    "sumdefault": f"guard, checksum_every={DEFAULT_CHECKSUM_EVERY} (default)",
    "defaults": f"guard, defaults (replay 50, checksum {DEFAULT_CHECKSUM_EVERY})",
}


def _post_backward_step(model: Any, loss_fn: Callable[..., Any], batch: Any, group: Any, size: int) -> None:
    """The guard's former data path: local gradients into fresh tensors, then one all-reduce per 25 MB bucket."""
    import torch
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss_fn(model, batch), params)
    bucket: list[int] = []
    nbytes = 0

    def flush() -> None:
        if bucket:
            flat = torch.cat([grads[i].reshape(-1) for i in bucket])
            dist.all_reduce(flat, group=group)
            flat.div_(size)
            offset = 0
            for i in bucket:
                n = grads[i].numel()
                params[i].grad = flat[offset : offset + n].view_as(params[i])
                offset += n
            bucket.clear()

    for i, g in enumerate(grads):
        if bucket and nbytes + g.numel() * g.element_size() > 25 * 1024 * 1024:
            flush()
            nbytes = 0
        bucket.append(i)
        nbytes += g.numel() * g.element_size()
    flush()


def _rank_main(rank: int, world: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard import SDCGuard, plan_roles
    from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    roles = plan_roles(1)
    group, workers = roles.dp_group, args.workers

    if args.comm:

        def fresh() -> nn.Module:
            torch.manual_seed(0)
            return nn.Sequential(
                *[nn.Sequential(nn.Linear(args.width, args.width), nn.GELU()) for _ in range(args.layers)]
            )

        def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return m(x).square().mean()

        def batch_of(step: int) -> torch.Tensor:
            return torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(step * 7 + rank))

        names = ["plain", "checks", "nopath", "post"]
    else:
        size = {"d": args.d, "heads": 4, "layers": args.layers, "seq": args.seq, "p": 0.1}

        def fresh() -> nn.Module:
            torch.manual_seed(0)
            return TinyTransformer(**size)

        loss_fn = lm_loss

        def batch_of(step: int) -> Any:
            return make_batch(step, rank, batch=args.batch, seq=args.seq)

        names = [
            "plain",
            "fwd+bwd",
            "checks",
            "nopath",
            "peer",
            "hooks",
            "shadow",
            "fsdp",
            "fsdp+peer",
            "sum1",
            "sumdefault",
            "defaults",
        ]
    if args.only:
        names = [n for n in names if n in {"plain", "checks", *args.only}]

    # The dedicated guard is built on every rank (collective); the shadow serves until the workers close it.
    shadow_model = fresh()
    dedicated = SDCGuard(
        shadow_model if roles.role == "shadow" else DDP(shadow_model, process_group=group),
        loss_fn,
        group=group,
        replay_every=10,
        shadows=list(roles.shadows),
        checksum_every=0,
    )
    if roles.role == "shadow":
        os.nice(19)  # spare cycles only: on a real cluster the shadow has a device of its own
        dedicated.serve()
        dist.destroy_process_group()
        return

    models: dict[str, nn.Module] = {}
    wrapped: dict[str, nn.Module] = {}
    guards: dict[str, SDCGuard] = {"shadow": dedicated}
    models["shadow"], wrapped["shadow"] = shadow_model, dedicated.model
    for name in names:
        if name == "shadow":
            continue
        m = fresh()
        models[name] = m
        if name.startswith("fsdp"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (workers,))
            for block in m.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(m, mesh=mesh)
            wrapped[name] = m
        elif name in ("fwd+bwd", "post"):
            wrapped[name] = m
        else:
            wrapped[name] = DDP(m, process_group=group)
        replays = {"checks": 0, "nopath": 0, "peer": 10, "hooks": 10, "fsdp+peer": 10, "sum1": 0, "sumdefault": 0}
        every = replays.get(name)
        if every is not None:
            sums = {"sum1": 1, "sumdefault": DEFAULT_CHECKSUM_EVERY}.get(name, 0)
            guards[name] = SDCGuard(wrapped[name], loss_fn, group=group, replay_every=every, checksum_every=sums)
            if name == "nopath":
                guards[name].taps.reduction.enabled = False  # a DDP model's taps: ParamTaps
        elif name == "defaults":
            guards[name] = SDCGuard(wrapped[name], loss_fn, group=group)
    opts = {n: torch.optim.SGD(m.parameters(), lr=1e-3) for n, m in models.items()}
    inside = {n: 0.0 for n in guards}
    timing = [False]

    def run(name: str, step: int) -> None:
        batch = batch_of(step)
        model, guard = wrapped[name], guards.get(name)
        if name == "fwd+bwd":
            torch.autograd.grad(loss_fn(model, batch), list(model.parameters()))
            return
        if name == "post":
            _post_backward_step(model, loss_fn, batch, group, workers)
        elif guard is None:
            loss_fn(model, batch).backward()
        else:  # the four calls guard.step makes, so the time inside the guard's own calls can be taken apart
            guard.begin_step(step)
            guard.before_forward(batch)
            loss = loss_fn(model, batch)
            guard.observe_loss(loss)
            loss.backward()
            t0 = time.perf_counter()
            report = guard.end_step()
            if timing[0]:
                inside[name] += time.perf_counter() - t0
            if not report.commit:
                raise RuntimeError(f"{name}: unexpected veto at step {step}: {report.incidents}")
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        if guard is not None:
            t0 = time.perf_counter()
            guard.after_optimizer_step()
            if timing[0]:
                inside[name] += time.perf_counter() - t0

    order = names if "shadow" in names or args.comm else names
    times: dict[str, list[float]] = {n: [] for n in order}
    step = {n: 0 for n in order}
    for r in range(args.rounds + 1):  # round 0 warms up
        timing[0] = r > 0
        for name in order:
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                run(name, step[name])
                step[name] += 1
            dist.barrier(group=group)
            if r:
                times[name].append((time.perf_counter() - t0) / args.steps)
    dedicated.close()
    if rank == 0:
        steps = args.rounds * args.steps
        queue.put((times, {n: v / steps for n, v in inside.items()}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps per configuration per round (multiple of 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--comm", action="store_true", help="the comm-bound configuration (a wide MLP)")
    parser.add_argument(
        "--mesh",
        nargs="?",
        const="tp",
        default=None,
        choices=["tp", "ep"],
        help="the 2-D configuration: dp=2 x tp=2 on 4 ranks (tp, the default), or dp=2 x ep=2, a mixture of experts "
        "(ep: benchmarks/ep_overhead.py)",
    )
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--layers", type=int, default=None, help="default: 4 (transformer), 8 (--comm)")
    parser.add_argument("--width", type=int, default=1024, help="--comm: width of each linear layer")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="default: 8 (transformer), 64 (--comm)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these configurations (with plain, checks)")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write the figures (per-round step times, "
        "time inside the guard's calls) to this file, for benchmarks/compare_commits.py",
    )
    args = parser.parse_args()
    args.layers = args.layers or (8 if args.comm else 4)
    args.batch = args.batch or (64 if args.comm else 8)
    if args.mesh == "ep":
        from benchmarks.ep_overhead import run as run_ep

        run_ep(args)
        return
    if args.mesh:
        from benchmarks.tp_overhead import run as run_tp

        run_tp(args)
        return

    import torch.multiprocessing as mp

    world = args.workers + 1
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, os.path.join(tmp, "store"), args, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        times, inside = queue.get(timeout=3600)
        for p in procs:
            p.join(60)

    med = {n: statistics.median(v) for n, v in times.items()}
    if args.json is not None:
        args.json.write_text(json.dumps({"times": times, "inside": inside}))

    def ratio(name: str, ref: str) -> tuple[float, float, float]:
        r = sorted(a / b - 1 for a, b in zip(times[name], times[ref]))
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
        return statistics.median(r), q[0], q[2]

    if args.comm:
        print(
            f"comm-bound: workers={args.workers} (+1 idle shadow), {args.layers} x Linear({args.width}) "
            f"({args.layers * args.width * args.width * 4 / 1e6:.0f} MB of fp32 gradients), batch={args.batch}, "
            f"threads/process={args.threads}, {args.rounds} rounds x {args.steps} steps"
        )
    else:
        print(
            f"workers={args.workers} + 1 shadow, transformer d={args.d} layers={args.layers} seq={args.seq} "
            f"batch={args.batch}, threads/process={args.threads}, {args.rounds} rounds x {args.steps} steps"
        )
    print(f"{'configuration':<40}{'step (ms)':>11}{'vs its baseline (median of rounds, IQR)':>42}")
    for name in times:
        ref = "fsdp" if name == "fsdp+peer" else "plain"
        m, lo, hi = ratio(name, ref)
        vs = "" if name in ("plain", "fsdp") else f"{m:>+14.1%}  [{lo:+.1%}, {hi:+.1%}]  vs {ref}"
        print(f"{LABELS[name]:<40}{med[name] * 1e3:>11.2f}  {vs}")
    print(
        "time inside the guard's own calls (end_step, after_optimizer_step) on worker 0, per step, as a share "
        "of its baseline's step:"
    )
    for name, t in inside.items():
        ref = "fsdp" if name == "fsdp+peer" else "plain"
        print(f"  {LABELS[name]:<38} {t * 1e3:7.2f} ms  {t / med[ref]:6.2%}")
    if "nopath" in times:
        m, lo, hi = ratio("checks", "nopath")
        print(f"the gradients' path into DDP's reduction: checks {m:+.1%} [{lo:+.1%}, {hi:+.1%}] vs nopath")
    if not args.comm:
        fb, base = med.get("fwd+bwd", med["plain"]), med["plain"]
        goal = 0.1 * fb / base + 0.01
        for name, ref in (("sum1", "checks"), ("sumdefault", "checks"), ("defaults", "plain")):
            if name in times:
                m, lo, hi = ratio(name, ref)
                own = (inside[name] - inside.get(ref, 0.0)) / med["plain"]
                goal_note = f"; goal <= 2% on average: {'met' if m <= 0.02 else 'NOT met'}"
                print(
                    f"{name}: {m:+.1%} [{lo:+.1%}, {hi:+.1%}] vs {ref}; inside end_step {own:+.2%} of a step"
                    + (goal_note if name == "sumdefault" else "")
                )
        for name, g, what in (("peer", goal, "a tenth of fwd+bwd + 1%"), ("shadow", 0.02, "2%")):
            if name not in times:
                continue
            total, own = ratio(name, "plain")[0], inside[name] / base
            print(
                f"{name}: overhead {total:+.1%}, {own:.1%} inside the guard's own calls; goal <= {what} = {g:.1%}: "
                f"step time {'met' if total <= g else 'NOT met'}, own calls {'met' if own <= g else 'NOT met'}"
            )


if __name__ == "__main__":
    main()
