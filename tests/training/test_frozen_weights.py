"""A frozen submodule (``requires_grad=False``: a LoRA or adapter job's base, most of its memory) is part of the
cross-replica weight check: a frozen weight corrupted in one rank's memory is named at the next weight check (it used
to be seen only on sampled steps, by replay)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sdcguard.testing import run_ranks

pytestmark = pytest.mark.distributed


def _job(rank: int, world: int, corrupt_at: int | None) -> list[Any]:
    warnings.filterwarnings("ignore")
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard import SDCGuard
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import corrupt_weights_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    model[0].requires_grad_(False)  # the frozen base; only the head trains

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    guard = SDCGuard(DDP(model), loss_fn, replay_every=0, weight_check_every=1, checksum_every=0, escalate="off")
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    seen = []
    for step in range(4):
        if step == corrupt_at:
            flip = Fault(pattern="bitflip", bit="exponent", elements=1)
            corrupt_weights_(model, flip, rank=1, names="0.weight")
        g = torch.Generator().manual_seed(10 * step + rank)
        report = guard.step(step, (torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)))
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        seen.append([(i.kind, tuple(i.suspect_ranks), i.parameter) for i in guard.after_optimizer_step()])
    return seen


@pytest.mark.timeout(200)
def test_a_corrupted_frozen_weight_is_named_at_the_next_weight_check() -> None:
    clean = run_ranks(_job, 3, None, timeout=180)
    assert clean == [[[]] * 4] * 3
    faulty = run_ranks(_job, 3, 2, timeout=180)
    assert faulty[0] == faulty[1] == faulty[2]
    assert faulty[0][:2] == [[], []]
    assert faulty[0][2] == [("weight_replica", (1,), "0.weight (frozen)")], faulty[0]
