"""The modules of one ``fully_shard([a, b])`` call share one FSDP2 state, one parameter group and one
reduce-scatter: the guard watches them as one unit (``a+b``), not two and not none, over gloo (3 ranks). A clean
run commits every step without an incident, and a one-off fault in ``a``'s weight gradient on one rank is vetoed
and named with that unit."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sdcguard.testing import run_ranks

pytestmark = pytest.mark.distributed

FAULTY = (2, 1)
"""(step, rank) of the fault."""
A_WEIGHT_GRAD = 4
"""The fifth ``mm`` of the backward: ``a``'s weight gradient (``head`` and ``b`` run two each before it; ``a``'s
input needs no gradient)."""


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.b(F.gelu(self.a(x)))))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _job(rank: int, world: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from sdcguard import SDCGuard
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode

    torch.manual_seed(0)
    net = Net()
    mesh = init_device_mesh("cpu", (world,))
    fully_shard([net.a, net.b], mesh=mesh)
    fully_shard(net, mesh=mesh)
    guard = SDCGuard(net, loss_fn, replay_every=1, weight_check_every=0, checksum_every=0, escalate="off")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = []
    for step in range(4):
        g = torch.Generator().manual_seed(step * 10 + rank)
        batch = (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
        mode = None
        if step == FAULTY[0]:
            fault = Fault(pattern="bitflip", bit="high_mantissa", timing="transient", seed=step)
            mode = OpFaultMode(
                fault, ops="mm", phase="backward", rank=FAULTY[1], steps=[step], occurrence=A_WEIGHT_GRAD
            )
            mode.step = step
        with mode if mode is not None else nullcontext():
            report = guard.step(step, batch)
        seen.append((report.commit, [(i.kind, i.suspect_ranks, i.parameter) for i in report.incidents]))
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
    guard.close()
    return {"seen": seen, "units": list(guard.taps.unit_names)}


@pytest.mark.timeout(120)
def test_the_modules_of_one_fully_shard_call_are_one_unit() -> None:
    results = run_ranks(_job, 3, timeout=100)
    for res in results:
        assert res["units"] == ["<root>", "a+b"]
        step, rank = FAULTY
        for s, (commit, incidents) in enumerate(res["seen"]):
            if s == step:
                assert not commit and incidents == [("replay", (rank,), "a+b")], res["seen"]
            else:
                assert commit and incidents == [], res["seen"]
    assert all(res["seen"] == results[0]["seen"] for res in results)
