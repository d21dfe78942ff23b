"""What the guard is handed, recognised before it chooses its hooks: a compiled model (``torch.compile`` around DDP
or FSDP2, inside DDP, or blocks compiled in place) is unwrapped and trains bit for bit as without the guard, the
checksums at their default included (they leave compiled code alone, and say so); it is never wrapped in a second
DDP; FSDP1 and ranks holding different parameters are refused in one line."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sdcguard.testing import run_ranks

pytestmark = pytest.mark.distributed


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.gelu(self.a(x)))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _wrap(setup: str, net: nn.Module, world: int) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    if setup == "compile(ddp)":
        return torch.compile(DDP(net))
    if setup == "ddp(compile)":
        return DDP(torch.compile(net))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    if setup == "compile(fsdp2)":
        return torch.compile(fully_shard(net, mesh=mesh))
    net.a.compile()  # torchtitan's order: blocks compiled in place, then sharded
    net.b.compile()
    fully_shard(net.a, mesh=mesh)
    fully_shard(net.b, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def _job(rank: int, world: int, setup: str, guarded: bool, fault_step: int | None) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from sdcguard import SDCGuard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import corrupt_tensor_

    torch.manual_seed(0)
    net = Net()
    model = _wrap(setup, net, world)
    if fault_step is not None and rank == 1:  # a faulty device's weight gradient, as its backward computes it
        step_box = [0]
        flip = Fault(pattern="bitflip", bit="exponent", timing="sticky", elements=1)
        net.a.weight.register_hook(lambda g: corrupt_tensor_(g, flip) and None if step_box[0] == fault_step else None)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    guard = SDCGuard(model, loss_fn, replay_every=2, escalate="off") if guarded else None  # checksum_every: default
    seen = []
    for step in range(4):
        if fault_step is not None and rank == 1:
            step_box[0] = step
        g = torch.Generator().manual_seed(step * 10 + rank)
        batch = (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
        if guard is not None:
            report = guard.step(step, batch)
            seen.append((report.commit, report.checks, [(i.kind, tuple(i.suspect_ranks)) for i in report.incidents]))
            kind = type(guard.model).__name__
        else:
            loss_fn(model, batch).backward()
            kind = ""
        if guard is None or report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in net.parameters()], "model": kind}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "setup",
    [
        "compile(ddp)",
        "compile(fsdp2)",
        # The other two orders of wrapping run with -m matrix (CI time: each is ~20 s of a 2-core run's 20 minutes).
        pytest.param("ddp(compile)", marks=pytest.mark.matrix),
        pytest.param("blocks-compiled fsdp2", marks=pytest.mark.matrix),
    ],
)
def test_a_compiled_model_trains_bit_for_bit_as_without_the_guard(setup: str) -> None:
    guarded = run_ranks(_job, 2, setup, True, None, timeout=380)
    plain = run_ranks(_job, 2, setup, False, None, timeout=380)
    for g, p in zip(guarded, plain, strict=True):
        assert g["fingerprints"] == p["fingerprints"], "the guard changed what the compiled model computes"
        assert all(commit and not incidents for commit, _, incidents in g["seen"]), g["seen"]
        assert [checks[-1:] == ("replay",) for _, checks, _ in g["seen"]] == [True, False, True, False]
        assert g["model"] != "DistributedDataParallel" or setup == "ddp(compile)"  # never a second DDP


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_fault_in_a_compiled_ddp_model_is_named_by_its_replay() -> None:
    seen = [r["seen"] for r in run_ranks(_job, 3, "compile(ddp)", True, 2, timeout=280)]
    assert seen[0] == seen[1] == seen[2]
    commit, _, incidents = seen[0][2]
    assert not commit and incidents == [("replay", (1,))], seen[0]


def _fsdp1(rank: int, world: int) -> str:
    from torch.distributed.fsdp import FullyShardedDataParallel

    from sdcguard import SDCGuard
    from sdcguard.errors import BadInput

    # FSDP1 needs an accelerator to be built; the guard reads only its type, so one is made without its __init__
    wrapped = FullyShardedDataParallel.__new__(FullyShardedDataParallel)
    nn.Module.__init__(wrapped)
    model = nn.Sequential(Net(), wrapped)
    try:
        SDCGuard(model, loss_fn)
    except BadInput as e:
        return str(e)
    return "accepted"


def _stages(rank: int, world: int) -> str:
    from sdcguard import SDCGuard
    from sdcguard.errors import BadInput

    stage = nn.Linear(16, 32) if rank == 0 else nn.Sequential(nn.GELU(), nn.Linear(32, 4))  # two pipeline stages
    try:
        SDCGuard(stage, loss_fn)
    except BadInput as e:
        return str(e)
    return "accepted"


@pytest.mark.timeout(200)
def test_fsdp1_and_ranks_of_different_parameters_are_refused_in_one_line() -> None:
    """FSDP1 used to be wrapped in DDP or compared shard against shard; two pipeline stages were wrapped in one
    DDP (``DDP expects same model across all ranks``). Each is one line now, the same on every rank."""
    said = run_ranks(_fsdp1, 2, timeout=180)
    assert said[0] == said[1] and "FSDP1" in said[0] and "fully_shard" in said[0] and "\n" not in said[0]
    said = run_ranks(_stages, 2, timeout=180)
    assert said[0] == said[1] and "different parameters" in said[0] and "group=" in said[0]


def test_reading_what_wraps_a_model_imports_no_wrapper_package() -> None:
    """The guard asks whether a model is FSDP1 or FSDP2 without importing ``torch.distributed.fsdp``: imported after
    ``init_process_group`` it keeps the job's gloo group alive past ``destroy_process_group()`` (see
    :func:`sdcguard.training.hooks.wrappers.imported`). A job that never imported it has no FSDP module."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from sdcguard.training.hooks.fsdp import is_fsdp\n"
        "from sdcguard.training.hooks.wrappers import peel, refuse_unsupported\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2))\n"
        "refuse_unsupported(m); peel(m); assert not is_fsdp(m)\n"
        "assert 'torch.distributed.fsdp' not in sys.modules, 'imported'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
