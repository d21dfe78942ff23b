"""Jobs for the memory and non-finite checks: a weight corrupted in one rank's memory between two steps (one
element, bit 30: the float's top exponent bit) on DDP, pure FSDP2 and FSDP2 x TP, and a non-finite loss from one
rank's data under DDP. Each rank returns what it saw per step and its parameters' fingerprints."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tests._tensor_parallel import TPNet, build, loss_fn, make_batch

STEPS, AT = 4, 2


def job(rank: int, world: int, layout: str, fault: str | None, faulty: int) -> dict[str, Any]:
    """``layout``: ``ddp`` (``guard.step`` wraps DDP), ``fsdp`` (FSDP2 over every rank: each element held once) or
    ``fsdp_tp`` (dp=2 x tp=2, FSDP2 over dp); ``fault``: ``memory`` (one element of ``up.weight``, this rank's own
    shard of it, flipped in memory before step :data:`AT`), ``nan`` (a NaN in the faulty rank's batch at
    :data:`AT`) or None."""
    warnings.filterwarnings("ignore")
    from sdcguard import SDCGuard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import corrupt_weights_

    dp_index = rank
    if layout == "ddp":
        torch.manual_seed(0)
        model: torch.nn.Module = TPNet()
    elif layout == "fsdp":
        _, model = build(world, 1)
    else:
        mesh, model = build(2, 2)
        dp_index = mesh.get_coordinate()[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = SDCGuard(model, loss_fn, replay_every=1, checksum_every=0, weight_check_every=1, escalate="off")
    seen: list[dict[str, Any]] = []
    for step in range(STEPS):
        if fault == "memory" and step == AT:
            flip = Fault(pattern="bitflip", bit=30, elements=1, seed=7)
            corrupt_weights_(model, flip, rank=faulty, names="up.weight")
        x, y = make_batch(step, dp_index)
        if fault == "nan" and step == AT and rank == faulty:
            x[0, 0] = float("nan")
        report = guard.step(step, (x, y))
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        weights = guard.after_optimizer_step()
        seen.append(
            {
                "commit": report.commit,
                "checks": report.checks,
                "incidents": [(i.kind, i.step, tuple(i.suspect_ranks)) for i in (*report.incidents, *weights)],
            }
        )
    finite = (
        all(
            bool(torch.isfinite(p.detach().full_tensor() if hasattr(p, "full_tensor") else p).all())
            for p in model.parameters()
        )
        if fault != "memory"
        else None
    )
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in model.parameters()], "finite": finite}
