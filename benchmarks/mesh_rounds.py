"""What the 4-rank mesh benchmarks (``replay_overhead.py --mesh tp|ep``: :mod:`benchmarks.tp_overhead`,
:mod:`benchmarks.ep_overhead`) share: starting their ranks, and printing each configuration's median step time, its
paired ratio to the baseline per round and the time inside the guard's calls as a share of a baseline step."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable

WORLD = 4


def spawn(target: Callable[..., None], args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Run ``target(rank, world, store_path, args, queue)`` on :data:`WORLD` spawned ranks; what rank 0 put in the
    queue: per configuration, the step times of each round and the seconds inside the guard's calls per step."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=target, args=(r, WORLD, store, args, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        times, inside = queue.get(timeout=3600)
        for p in procs:
            p.join(60)
    return times, inside


def report(title: str, times: dict[str, list[float]], inside: dict[str, float], baseline: str) -> None:
    """Print ``title`` and a line per configuration (see the module docstring)."""
    med = {n: statistics.median(v) for n, v in times.items()}
    print(title)
    for name in times:
        r = sorted(a / b - 1 for a, b in zip(times[name], times[baseline]))
        vs = "" if name == baseline else f"{statistics.median(r):>+14.1%}  [{r[0]:+.1%}, {r[-1]:+.1%}]  vs {baseline}"
        own = (
            f"; inside the guard's calls {inside[name] * 1e3:.2f} ms = {inside[name] / med[baseline]:.2%}"
            if name in inside
            else ""
        )
        print(f"  {name:<12}{med[name] * 1e3:>11.2f} ms {vs}{own}")
