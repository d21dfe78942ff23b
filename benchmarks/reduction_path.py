"""Per-step cost of the check of the gradients' path into DDP's reduction (:mod:`sdcguard.training.hooks.bucket`):
the tensor hooks' fingerprint of what DDP should reduce and the comm hook's fingerprint of the buckets, as a share
of a DDP training step, 2 gloo ranks on CPU.

    python benchmarks/reduction_path.py [--d 256] [--layers 6] [--batch 8] [--seq 256] [--rounds 10] [--threads 1]
                                        [--mlp WIDTH] [--micro K]

The ~9M-parameter transformer language model of ``benchmarks/memory_check.py`` (or, with ``--mlp``, ``--layers``
x Linear(WIDTH) with GELU on a batch of ``--batch`` rows: the gradient-heavy, communication-bound case of
``benchmarks/replay_overhead.py --comm``) trains with AdamW under DDP (``--micro``: ``K`` micro-batches of
``--batch`` each, accumulated under ``no_sync``) and ``SDCGuard(replay_every=0, checksum_every=0)``. Each round runs
two steps back to back, one with the check on and one with it off (``guard.taps.reduction.enabled``), so machine
load hits both alike, and times on rank 0 the work the check itself does inside the backward (its two public calls,
``ReductionWatch.expect`` and ``compare``, timed by wrapping them). Prints the medians: the check's own work as a
share of a step (the figure ``docs/costs.md`` quotes), and the paired step-time ratio (noisier: the 2 ranks share 2
cores with each other).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.replica_overhead import _model  # noqa: E402


def _timed(fn: Callable[..., Any], box: list[float]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            box[0] += time.perf_counter() - t0

    return call


def _rank(rank: int, world: int, cfg: dict[str, int]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard import SDCGuard

    torch.set_num_threads(cfg["threads"])
    width = cfg["mlp"]
    if width:
        torch.manual_seed(0)
        layers = [m for _ in range(cfg["layers"]) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
        model: torch.nn.Module = torch.nn.Sequential(*layers)
    else:
        model = _model(cfg["vocab"], cfg["d"], cfg["layers"], cfg["seq"])
    ddp = DDP(model)

    def loss_fn(m: Any, batch: Any) -> Any:
        if width:
            return m(batch).square().mean()
        logits = m(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    guard = SDCGuard(ddp, loss_fn, replay_every=0, checksum_every=0, slow=None, weight_check_every=0)
    watch = guard.taps.reduction  # type: ignore[union-attr]  # a DDP model's taps: ParamTaps
    inside = [0.0]
    watch.expect = _timed(watch.expect, inside)
    watch.compare = _timed(watch.compare, inside)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    times: dict[str, list[float]] = {"on": [], "off": [], "inside": []}
    for r in range(cfg["rounds"] + 2):
        for on in (True, False) if r % 2 else (False, True):
            watch.enabled = on
            inside[0] = 0.0
            if width:
                tokens = torch.randn(cfg["batch"], width, generator=gen)
            else:
                tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=gen)
            t0 = time.perf_counter()
            report = guard.step(r, micro_batches=[tokens] * cfg["micro"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            guard.after_optimizer_step()
            step = time.perf_counter() - t0
            assert report.commit and ("reduction" in report.checks) is on, report
            if r >= 2:  # two warm-up rounds (DDP rebuilds its buckets after the first backward)
                times["on" if on else "off"].append(step)
                if on:
                    times["inside"].append(inside[0])
    guard.close()
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "ratio": statistics.median(a / b for a, b in zip(times["on"], times["off"])),
        **{k: statistics.median(v) for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    from sdcguard.testing import run_ranks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mlp", type=int, default=0, help="WIDTH: an MLP of --layers x Linear(WIDTH) instead")
    ap.add_argument("--micro", type=int, default=1, help="micro-batches accumulated per step")
    cfg = vars(ap.parse_args(argv))
    out = run_ranks(_rank, 2, cfg, timeout=3600)[0]
    shape = (
        f"{cfg['layers']} x Linear({cfg['mlp']}), batch {cfg['batch']}"
        if cfg["mlp"]
        else (f"transformer, batch {cfg['batch']} x seq {cfg['seq']}")
    )
    print(
        f"model: {out['params'] / 1e6:.1f}M parameters (fp32, {shape}), DDP over 2 gloo ranks, {cfg['threads']} "
        f"thread(s) per rank, {cfg['micro']} micro-batch(es) per step, median of {cfg['rounds']} rounds (rank 0)"
    )
    print(f"training step (guard.step, AdamW, after_optimizer_step), path check off: {out['off'] * 1e3:.1f} ms")
    print(f"the path check's own work: {out['inside'] * 1e3:.2f} ms = {out['inside'] / out['off']:.2%} of a step")
    print(f"step with the check on vs off (paired rounds): {out['ratio'] - 1:+.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
