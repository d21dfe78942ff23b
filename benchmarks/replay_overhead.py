"""What the training guard costs the workers: step time without the guard, with peer replay, with a dedicated shadow.

One launch, side by side, interleaved in rounds so machine noise hits every configuration alike:

- ``plain``: DDP forward + backward + SGD step, no guard (the baseline);
- ``fwd+bwd``: forward and backward alone, no communication (the unit of the peer-mode goal);
- ``checks``: ``SDCGuard(replay_every=0)``: the every-step cross-replica gradient check and the guard's own
  all-reduce, without any replay (what peer and shadow modes share);
- ``peer``: ``SDCGuard(replay_every=10, shadows="peer")``;
- ``shadow``: ``SDCGuard(replay_every=10, shadows=[last rank])``, the shadow replaying while workers go on.

Goals (issue 4): peer mode costs at most a tenth of a forward+backward plus 1% of a step; a dedicated shadow costs
the workers at most 2%. Run::

    python benchmarks/replay_overhead.py [--workers 2] [--rounds 8] [--steps 10] [--threads 1]

Besides the step times it prints the time spent inside the guard's own work on worker 0 (the every-step checks;
the sampled-step replays, exchanges, sends and verdicts), which does not depend on comparing noisy steps.

The default model (d=256, 4 layers, 128 tokens, ~0.5 s steps here) is sized so that the step is long against a
collective's latency: on a 2-core VM running 3 processes a small gloo collective takes 1-2 ms (NCCL: tens of
microseconds), so with the 50 ms steps of ``--d 128 --layers 2 --seq 64`` the figures mostly measure that
latency. On a machine with fewer cores than processes the shadow competes with the workers for CPU (it runs at
the lowest priority here); on a real cluster it has its own device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _rank_main(rank: int, world: int, store_path: str, args: argparse.Namespace, queue: object) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from _tiny_transformer import TinyTransformer, lm_loss, make_batch
    from sdcguard.guard import SDCGuard
    from sdcguard.shadows import plan_roles

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    roles = plan_roles(1)
    size = {"d": args.d, "heads": 4, "layers": args.layers, "seq": args.seq, "p": 0.1}

    def fresh() -> torch.nn.Module:
        torch.manual_seed(0)
        return TinyTransformer(**size)

    # The dedicated guard is built on every rank (collective); the shadow serves until the workers close it.
    shadow_model = fresh()
    dedicated = SDCGuard(shadow_model, lm_loss, group=roles.dp_group, replay_every=10, shadows=list(roles.shadows))
    if roles.role == "shadow":
        os.nice(19)  # spare cycles only: on a real cluster the shadow has a device of its own
        dedicated.serve()
        dist.destroy_process_group()
        return

    group = roles.dp_group
    plain_model, peer_model, fb_model, checks_model = fresh(), fresh(), fresh(), fresh()
    plain = DDP(plain_model, process_group=group)
    peer = SDCGuard(DDP(peer_model, process_group=group), lm_loss, group=group, replay_every=10)
    checks = SDCGuard(DDP(checks_model, process_group=group), lm_loss, group=group, replay_every=0)
    guards = {"peer": peer, "checks": checks, "shadow": dedicated}
    # Time inside the guard's own work (wall time of these calls on this worker, summed over timed steps): the
    # figure that does not depend on comparing two sets of noisy steps.
    inside: dict[str, dict[str, float]] = {n: {"checks": 0.0, "sampled": 0.0} for n in guards}
    timing = [False]

    def timed(name: str, guard: SDCGuard, method: str, part: str) -> None:
        real = getattr(guard, method)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                if timing[0]:
                    inside[name][part] += time.perf_counter() - t0

        setattr(guard, method, wrapper)

    for name, guard in guards.items():
        timed(name, guard, "_check_reduced", "checks")
        timed(name, guard, "_sampled_round", "sampled")
        timed(name, guard, "_collect_arrived", "sampled")
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in
            (("plain", plain_model), ("peer", peer_model), ("shadow", shadow_model), ("checks", checks_model))}
    batch_of = lambda step: make_batch(step, rank, batch=args.batch, seq=args.seq)  # noqa: E731

    def run(name: str, step: int) -> None:
        batch = batch_of(step)
        if name == "plain":
            lm_loss(plain, batch).backward()
        elif name == "fwd+bwd":
            with torch.enable_grad():
                loss = lm_loss(fb_model, batch)
                torch.autograd.grad(loss, list(fb_model.parameters()))
            return
        else:
            report = guards[name].step(step, batch)
            if not report.commit:
                raise RuntimeError(f"{name}: unexpected veto at step {step}: {report.incidents}")
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        if name != "plain":
            guards[name].after_optimizer_step()

    names = ("plain", "fwd+bwd", "checks", "peer", "shadow")
    times: dict[str, list[float]] = {n: [] for n in names}
    step = {n: 0 for n in names}
    for r in range(args.rounds + 1):  # round 0 warms up
        timing[0] = r > 0
        for name in names:
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
        per_step = {n: {k: v / steps for k, v in d.items()} for n, d in inside.items()}
        queue.put((times, per_step))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps per configuration per round (multiple of 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    import torch.multiprocessing as mp

    world = args.workers + 1
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank_main, args=(r, world, os.path.join(tmp, "store"), args, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        times, inside = queue.get(timeout=3600)
        for p in procs:
            p.join(60)

    # Paired per round: each configuration against the no-guard steps of the same round (machine load drifts).
    med = {n: statistics.median(v) for n, v in times.items()}
    base, fb = med["plain"], med["fwd+bwd"]

    def ratio(name: str, ref: str = "plain") -> tuple[float, float, float]:
        r = sorted(a / b - 1 for a, b in zip(times[name], times[ref]))
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
        return statistics.median(r), q[0], q[2]

    print(f"workers={args.workers} + 1 shadow, model d={args.d} layers={args.layers} seq={args.seq} "
          f"batch={args.batch}, threads/process={args.threads}, {args.rounds} rounds x {args.steps} steps")
    print(f"{'configuration':<32}{'step (ms)':>11}{'vs plain (median of rounds, IQR)':>36}")
    for name, label in (("plain", "no guard (DDP)"), ("fwd+bwd", "forward+backward only"),
                        ("checks", "guard, replay off"), ("peer", "guard, peer, replay_every=10"),
                        ("shadow", "guard, dedicated shadow")):
        m, lo, hi = ratio(name)
        print(f"{label:<32}{med[name] * 1e3:>11.2f}{m:>+14.1%}  [{lo:+.1%}, {hi:+.1%}]")
    peer_goal = 0.1 * fb / base + 0.01
    print("time inside the guard's own work on worker 0, per step, as a share of a no-guard step:")
    for name, label in (("checks", "replay off"), ("peer", "peer"), ("shadow", "dedicated shadow")):
        d = inside[name]
        print(f"  {label:<18} every-step checks {d['checks'] / base:6.2%}   sampled-step work "
              f"{d['sampled'] / base:6.2%}   (replays, exchanges, sends, verdicts; amortized)")
    for name, goal, what in (("peer", peer_goal, "a tenth of fwd+bwd + 1%"), ("shadow", 0.02, "2%")):
        total = ratio(name)[0]
        replay_only = statistics.median((a - c) / b for a, b, c in zip(times[name], times["plain"], times["checks"]))
        own = (inside[name]["checks"] + inside[name]["sampled"]) / base
        print(f"{name}: overhead {total:+.1%} in all, {replay_only:+.1%} for replay alone (beyond the every-step "
              f"checks), {own:.1%} inside the guard's own work; goal <= {what} = {goal:.1%}: total "
              f"{'met' if total <= goal else 'NOT met'}, replay alone {'met' if replay_only <= goal else 'NOT met'}, "
              f"own work {'met' if own <= goal else 'NOT met'}")


if __name__ == "__main__":
    main()
