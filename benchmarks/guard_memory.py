"""What the guard costs in memory: peak memory growth of training steps with and without it, as multiples of the
model's parameter bytes, side by side in one run.

Each configuration runs in fresh processes (2 data-parallel ranks over gloo, plus a shadow rank where it has one):
the model is built and wrapped, then the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) is
measured over ``--steps`` training steps (forward, backward, SGD step), minus the resident set before them; on CUDA
``torch.cuda.max_memory_allocated`` too. Configurations:

- ``ddp``: plain DDP, no guard (the baseline: gradients, DDP's buckets, activations);
- ``checks``: ``SDCGuard(replay_every=0)``: the every-step cross-replica checks only;
- ``peer``: ``SDCGuard(replay_every=1)``: a peer replay on every step;
- ``shadow``: ``SDCGuard(replay_every=1, shadows=[last rank])``: workers and the dedicated shadow reported apart;
- ``fsdp`` and ``fsdp-peer``: the same model sharded with FSDP2 (per layer), without and with the guard.

Goals (issue 18): checks only add at most 0.1x the parameter bytes over plain DDP; peer replay at most the
replayed micro-batch's activations plus 0.1x. Run::

    python benchmarks/guard_memory.py [--layers 6] [--width 2048] [--batch 8] [--steps 3] [--configs ...]

Large blocks are allocated with ``mmap`` (``MALLOC_MMAP_THRESHOLD_=65536``) so that a freed block leaves the resident
set at once and the peak is what was live, not what glibc kept. The default model is an MLP of 6 linear layers of
2048x2048 (25.2M parameters, 101 MB in fp32) fed a batch of 8, so activations are small against the parameters and the
figures show what the guard itself keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

CONFIGS = ("ddp", "checks", "peer", "shadow", "fsdp", "fsdp-peer")


def _rss() -> tuple[int, int]:
    """(current, peak) resident set of this process, in bytes."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def _rank(rank: int, world: int, config: str, layers: int, width: int, batch: int, steps: int) -> dict[str, Any]:
    import gc

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard import SDCGuard, plan_roles

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers)])
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gen = torch.Generator().manual_seed(rank)
    data = [torch.randn(batch, width, generator=gen) for _ in range(steps)]

    def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).square().mean()

    role, guard = "worker", None
    if config == "shadow":
        roles = plan_roles(1)
        role = roles.role
        wrapped = DDP(model, process_group=roles.dp_group) if role == "worker" else model
        guard = SDCGuard(
            wrapped, loss_fn, group=roles.dp_group, replay_every=1, weight_check_every=0, shadows=list(roles.shadows)
        )
    elif config.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        wrapped = model
        if config == "fsdp-peer":
            guard = SDCGuard(model, loss_fn, replay_every=1, weight_check_every=0)
    else:
        wrapped = DDP(model)
        if config != "ddp":
            guard = SDCGuard(wrapped, loss_fn, replay_every=1 if config == "peer" else 0, weight_check_every=0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gc.collect()
    base, _ = _rss()
    _reset_peak()
    if role == "shadow":
        assert guard is not None
        guard.serve()
    else:
        for step, x in enumerate(data):
            if guard is not None:
                assert guard.step(step, x).commit
            else:
                loss_fn(wrapped, x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if guard is not None:
            guard.close()
    _, peak = _rss()
    out = {
        "role": role,
        "growth": peak - base,
        "param_bytes": param_bytes,
        "activations": batch * width * 4 * layers * 2,
    }
    if torch.cuda.is_available():
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    return out


def measure(config: str, *, layers: int, width: int, batch: int, steps: int) -> list[dict[str, Any]]:
    """Every rank's figures for one configuration (fresh processes)."""
    from sdcguard.testing import run_ranks

    # glibc serves large blocks from its heap once it has seen them freed (the mmap threshold adapts) and keeps
    # them resident: a fixed threshold returns every freed block, so the peak resident set is what was live.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))
    world = 3 if config == "shadow" else 2
    # Spawned, not forked from the fork server: a forked rank's first writes to the pages it inherited (torch's
    # modules) count as growth, a few MB that differ between configurations and are no part of the guard's memory.
    return run_ranks(_rank, world, config, layers, width, batch, steps, timeout=600, start_method="spawn")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {}
    for config in args.configs:
        rows[config] = measure(config, layers=args.layers, width=args.width, batch=args.batch, steps=args.steps)
    pb = next(iter(rows.values()))[0]["param_bytes"]
    print(
        f"model: {args.layers} x Linear({args.width}, {args.width}) + GELU, {pb / 4 / 1e6:.1f}M parameters "
        f"({pb / 1e6:.0f} MB fp32), batch {args.batch}, {args.steps} steps, 2 data-parallel ranks over gloo"
    )
    base = max(r["growth"] for r in rows["ddp"]) if "ddp" in rows else None
    print(f"{'configuration':<14} {'role':<8} {'peak growth':>12} {'x params':>9} {'over ddp':>9}")
    for config, ranks in rows.items():
        for role in ("worker", "shadow"):
            mine = [r for r in ranks if r["role"] == role]
            if not mine:
                continue
            growth = max(r["growth"] for r in mine)
            over = "" if base is None or role == "shadow" else f"{(growth - base) / pb:+.2f}x"
            print(f"{config:<14} {role:<8} {growth / 1e6:>10.0f}MB {growth / pb:>8.2f}x {over:>9}")
    print(f"(activations of one micro-batch: about {rows[next(iter(rows))][0]['activations'] / 1e6:.2f} MB)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
