"""Slow ranks in training: how fast a slowed rank is named, false naming in clean runs, and what timing costs.

A 2-rank DDP job over gloo, one rank per core (tests/_dist.py), an MLP (256 -> 768 -> 768 -> 8, batch 64),
``replay_every=2``:

- ``--drills`` runs of ``--steps-drill`` steps (20) where rank 1 runs under ``SlowOpsMode(--factor)`` (each op
  burns ``factor - 1`` times its own time in extra work) and rank 0 under ``SlowOpsMode(1.0)`` (the same Python
  dispatch cost): the step at which rank 1 is named, and the slowdown the incident reports;
- ``--clean`` runs of ``--steps-clean`` steps (200) without any mode: how many ranks were named;
- the cost: ``--rounds`` rounds of ``--steps-cost`` steps with timing on (the default ``SlowWatch()``) and off
  (``slow=None``), alternated in one run; the median over rounds of the paired step-time ratio.

    python benchmarks/slow_training.py [--drills 5] [--clean 3] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._dist import run_ranks  # noqa: E402


def _job(rank: int, world: int, steps: int, slowed: int | None, factor: float, timed: bool) -> dict[str, Any]:
    import contextlib

    import torch
    from torch import nn

    import sdcguard
    from sdcguard.inject.torch_slow import SlowOpsMode
    from sdcguard.training.timing import SlowWatch

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 768), nn.Tanh(), nn.Linear(768, 768), nn.Tanh(), nn.Linear(768, 8))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    guard = sdcguard.SDCGuard(ddp, loss_fn, replay_every=2, slow=SlowWatch() if timed else None)
    g = torch.Generator().manual_seed(rank)
    named_at = None
    t0 = time.perf_counter()
    for step in range(steps):
        batch = (torch.randn(64, 256, generator=g), torch.randint(0, 8, (64,), generator=g))
        with SlowOpsMode(factor if rank == slowed else 1.0) if slowed is not None else contextlib.nullcontext():
            report = guard.step(step, batch)
        opt.step()
        opt.zero_grad()
        if named_at is None and any(i.kind == "slow" for i in report.incidents):
            named_at = step
    wall = time.perf_counter() - t0
    slow = [i for i in guard.incidents if i.kind == "slow"]
    return {"named_at": named_at, "ranks": [i.suspect_ranks for i in slow], "detail": [i.detail for i in slow],
            "step_s": wall / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drills", type=int, default=5)
    ap.add_argument("--steps-drill", type=int, default=20)
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--clean", type=int, default=3)
    ap.add_argument("--steps-clean", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps-cost", type=int, default=40)
    args = ap.parse_args()
    named = []
    for n in range(args.drills):
        r = run_ranks(_job, 2, args.steps_drill, 1, args.factor, True, timeout=300)[0]
        named.append(r["named_at"])
        print(f"drill {n}: rank(s) named {r['ranks']} at step {r['named_at']}; load {os.getloadavg()[0]:.1f}; "
              f"{(r['detail'] or [''])[0][:160]}", flush=True)
    false = 0
    for n in range(args.clean):
        r = run_ranks(_job, 2, args.steps_clean, None, 1.0, True, timeout=600)[0]
        false += bool(r["ranks"])
        print(f"clean {n}: {args.steps_clean} steps, named {r['ranks']}; load {os.getloadavg()[0]:.1f}", flush=True)
    ratios = []
    for n in range(args.rounds):
        on, off = (run_ranks(_job, 2, args.steps_cost, None, 1.0, timed, timeout=300)[0]["step_s"]
                   for timed in ((True, False) if n % 2 == 0 else (False, True)))
        ratios.append(on / off - 1.0)
        print(f"cost round {n}: step {on * 1e3:.1f} ms timed, {off * 1e3:.1f} ms not ({ratios[-1]:+.1%})", flush=True)
    hit = [s for s in named if s is not None]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    print(f"\nslowed by {args.factor}x: named in {len(hit)}/{args.drills} drills of {args.steps_drill} steps "
          f"(at steps {sorted(hit)}); clean runs of {args.steps_clean} steps that named a rank: {false}/{args.clean}; "
          f"timing's cost: {statistics.median(ratios):+.1%} step time [{q[0]:+.1%}, {q[2]:+.1%}] over {args.rounds} "
          f"rounds of {args.steps_cost} steps")


if __name__ == "__main__":
    main()
