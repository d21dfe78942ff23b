"""Slow ranks in training: how fast a slowed rank is named, false naming in clean runs, and what timing costs.

A 2-rank DDP job over gloo, one rank per core (sdcguard.testing), an MLP (256 -> 768 -> 768 -> 8,
batch 64), ``replay_every=2``:

- ``--drills`` runs of ``--steps-drill`` steps (20) where rank 1 runs under ``SlowOpsMode(--factor)`` (each op
  burns ``factor - 1`` times its own time in extra work) and rank 0 under ``SlowOpsMode(1.0)`` (the same Python
  dispatch cost): the step at which rank 1 is named, and the slowdown the incident reports;
- ``--clean`` runs of ``--steps-clean`` steps (200) without any mode: how many ranks were named;
- the cost: the timing's own work per step (the clock reads of :class:`~sdcguard.training.timing.PhaseClock` and its
  six int64 columns, timed in this process over 20,000 steps) against the clean runs' step time; and, with
  ``--rounds N``, N rounds of ``--steps-cost`` steps with timing on and off alternated (on this loaded machine
  their paired ratios spread by +-40%: too noisy to show a cost this small).

    python benchmarks/slow_training.py [--drills 5] [--clean 3] [--rounds 0]
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

from sdcguard.testing import run_ranks  # noqa: E402


def _job(
    rank: int, world: int, steps: int, slowed: int | None, factor: float, timed: bool, threshold: float = 0.25
) -> dict[str, Any]:
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

    guard = sdcguard.SDCGuard(ddp, loss_fn, replay_every=2, slow=SlowWatch(threshold=threshold) if timed else None)
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
    peaks = [r.peak_lower_bound for r in guard.slowness.values() if r.peak_lower_bound is not None]
    return {
        "named_at": named_at,
        "ranks": [i.suspect_ranks for i in slow],
        "detail": [i.detail for i in slow],
        "step_s": wall / steps,
        "peak": max(peaks, default=None),
        "medians": {g: statistics.median(r.samples) for g, r in guard.slowness.items() if r.samples},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drills", type=int, default=5)
    ap.add_argument("--steps-drill", type=int, default=20)
    ap.add_argument("--factor", type=float, default=1.5)
    ap.add_argument("--clean", type=int, default=3)
    ap.add_argument("--steps-clean", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--steps-cost", type=int, default=40)
    ap.add_argument("--threshold", type=float, default=0.25, help="SlowWatch threshold")
    args = ap.parse_args()
    named = []
    for n in range(args.drills):
        r = run_ranks(_job, 2, args.steps_drill, 1, args.factor, True, args.threshold, timeout=300)[0]
        named.append(r["named_at"])
        print(
            f"drill {n}: rank(s) named {r['ranks']} at step {r['named_at']}; load {os.getloadavg()[0]:.1f}; "
            f"{(r['detail'] or [''])[0][:160]}",
            flush=True,
        )
    false = 0
    steps_s = []
    for n in range(args.clean):
        r = run_ranks(_job, 2, args.steps_clean, None, 1.0, True, args.threshold, timeout=600)[0]
        false += bool(r["ranks"])
        steps_s.append(r["step_s"])
        print(
            f"clean {n}: {args.steps_clean} steps, named {r['ranks']}; highest lower bound of a rank's median "
            f"slowdown {r['peak']:.3f} (named above {1 + args.threshold:g}); medians "
            f"{ {g: round(m, 3) for g, m in r['medians'].items()} }; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    ratios = []
    for n in range(args.rounds):
        on, off = (
            run_ranks(_job, 2, args.steps_cost, None, 1.0, timed, timeout=300)[0]["step_s"]
            for timed in ((True, False) if n % 2 == 0 else (False, True))
        )
        ratios.append(on / off - 1.0)
        print(f"cost round {n}: step {on * 1e3:.1f} ms timed, {off * 1e3:.1f} ms not ({ratios[-1]:+.1%})", flush=True)
    hit = [s for s in named if s is not None]
    own = _own_cost()
    step = statistics.median(steps_s) if steps_s else float("nan")
    print(
        f"\nslowed by {args.factor}x: named in {len(hit)}/{args.drills} drills of {args.steps_drill} steps "
        f"(at steps {sorted(hit)}); clean runs of {args.steps_clean} steps that named a rank: {false}/{args.clean}; "
        f"the timing's own work: {own * 1e6:.1f} us per step, {own / step:.3%} of the clean runs' median step "
        f"({step * 1e3:.1f} ms)" + (f"; on/off rounds: median {statistics.median(ratios):+.1%}" if ratios else "")
    )


def _own_cost(steps: int = 20_000) -> float:
    """Seconds of the timing's own work per step: every PhaseClock call a step makes, and its columns' tensor."""
    import torch

    from sdcguard.training.timing import PhaseClock

    clock = PhaseClock(torch.device("cpu"))
    t0 = time.perf_counter()
    for n in range(steps):
        clock.begin_step()
        clock.end_compute(n if n % 2 == 0 else None)
        with clock.replay():
            pass
        clock.settle()
        torch.tensor(clock.columns(), dtype=torch.int64)
        with clock.waiting():
            pass
        clock.end_step()
    return (time.perf_counter() - t0) / steps


if __name__ == "__main__":
    main()
