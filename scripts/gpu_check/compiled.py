"""Section ``compiled``: compiled models under the guard on CUDA, checksums at their default.

Two setups, each trained ``STEPS`` steps without the guard and then with it (``replay_every=1``, ``checksum_every``
at its default), from the same weights and batches:

- ``compile(ddp)``: ``torch.compile(DDP(net))``, ``DDP_WORLD`` ranks sharing ``cuda:0`` over gloo (NCCL refuses two
  ranks on one device); a sticky fault in rank ``FAULTY_RANK``'s weight gradient (a tensor hook) at ``FAULT_STEP``;
- ``blocks fsdp2``: each block compiled in place, then ``fully_shard`` per block and on the root (torchtitan's
  order), one NCCL rank on ``cuda:0``, whose replay is a rerun on its own device; a one-off fault in the output of
  the root's uncompiled head on that rank at ``FAULT_STEP`` (a forward hook, outside the compiled code).

Checked for each: every clean step commits with no incident; the guarded run's weights are bit for bit the
unguarded run's (the guard, its checksums at their default included, leaves compiled code computing what it
computes); no matmul is checksum-run (the checksums stay out of compiled regions, with a warning); the faulty step
is vetoed on every rank and its incident names the faulty rank alone (a third run, with the fault; the
bit-identity comparison uses the clean runs only).

``run_job(device="cpu", backend="aot_eager")`` runs the same jobs on CPU tensors over gloo (the tests do, with the
cheap ``aot_eager`` compile backend); on a GPU the backend is inductor, torch.compile's default.
"""

from __future__ import annotations

import os
from typing import Any

from sdcguard.testing import RankFailed, run_ranks

from .context import Context
from .results import SectionReport

__all__ = ["run", "run_job", "evaluate", "SETUPS", "STEPS", "FAULT_STEP", "FAULTY_RANK", "DDP_WORLD"]

SETUPS = ("compile(ddp)", "blocks fsdp2")
STEPS = 4
FAULT_STEP = 2
FAULTY_RANK = 1
"""The faulty rank of ``compile(ddp)`` (``blocks fsdp2`` has one rank, 0)."""
DDP_WORLD = 3
"""Three replicas: a sticky fault is then named by a majority, not left unresolved between two devices."""


def _net(torch: Any) -> Any:
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(32, 64), nn.Linear(64, 64)])
            self.head = nn.Linear(64, 8)

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = torch.nn.functional.gelu(block(x))
            return self.head(x)

    return Net()


def _loss(model: Any, batch: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(model(batch[0]), batch[1])


def _wrap(torch: Any, setup: str, net: Any, backend: str, world: int, device: Any) -> Any:
    if setup == "compile(ddp)":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device] if device.type == "cuda" else None
        return torch.compile(DDP(net, device_ids=ids), backend=backend)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for block in net.blocks:  # torchtitan's order: blocks compiled in place, then sharded
        block.compile(backend=backend)
        fully_shard(block, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def _fault_hooks(torch: Any, setup: str, net: Any, rank: int, box: dict[str, Any]) -> None:
    """The faulty device: a flipped exponent bit in one element, on ``FAULTY_RANK`` (DDP) or rank 0 (FSDP2)."""
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import corrupt_tensor_

    if setup == "compile(ddp)":
        if rank != FAULTY_RANK:
            return
        sticky = Fault(pattern="bitflip", bit="exponent", timing="sticky", elements=1)

        def corrupt_grad(grad: Any) -> None:  # every computation of that step on this rank: a sticky fault
            if box["step"] == FAULT_STEP:
                box["changed"] = box.get("changed", 0) + len(corrupt_tensor_(grad, sticky))

        net.blocks[0].weight.register_hook(corrupt_grad)
        return
    flip = Fault(pattern="bitflip", bit="exponent", timing="transient", elements=1)

    def corrupt_once(module: Any, args: Any, output: Any) -> None:
        if box["step"] == FAULT_STEP and not box.get("done"):
            box["done"] = True
            with torch.no_grad():
                box["changed"] = len(corrupt_tensor_(output, flip))

    net.head.register_forward_hook(corrupt_once)


def _train(rank: int, world: int, setup: str, backend: str, device: Any, guarded: bool, faulty: bool) -> dict[str, Any]:
    import torch

    from sdcguard import SDCGuard
    from sdcguard.fingerprints import fingerprint

    torch.manual_seed(0)
    net = _net(torch).to(device)
    model = _wrap(torch, setup, net, backend, world, device)
    box: dict[str, Any] = {"step": -1}
    if faulty:
        _fault_hooks(torch, setup, net, rank, box)
    guard = SDCGuard(model, _loss, replay_every=1, weight_check_every=1, escalate="off") if guarded else None
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    steps = []
    for step in range(STEPS):
        box["step"] = step
        g = torch.Generator().manual_seed(step * 10 + rank)
        batch = (torch.randn(16, 32, generator=g).to(device), torch.randint(0, 8, (16,), generator=g).to(device))
        if guard is not None:
            report = guard.step(step, batch)
            steps.append(
                {
                    "step": step,
                    "commit": bool(report.commit),
                    "incidents": [{"kind": i.kind, "suspect_ranks": list(i.suspect_ranks)} for i in report.incidents],
                    "matmuls_run": int(report.matmuls_run),
                }
            )
        else:
            _loss(model, batch).backward()
        if guard is None or report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None:
            guard.after_optimizer_step()
    if guard is not None:
        guard.close()
    return {
        "steps": steps,
        "fingerprints": [fingerprint(p) for p in net.parameters()],
        "injected": int(box.get("changed", 0)),
    }


def _rank_job(rank: int, world: int, setup: str, backend: str, device_type: str) -> dict[str, Any]:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda" and setup == "compile(ddp)":
        device = torch.device("cuda", 0)  # the ranks share cuda:0 over gloo
        torch.cuda.set_device(device)
    plain = _train(rank, world, setup, backend, device, guarded=False, faulty=False)
    clean = _train(rank, world, setup, backend, device, guarded=True, faulty=False)
    faulty = _train(rank, world, setup, backend, device, guarded=True, faulty=True)
    return {"plain": plain, "clean": clean, "faulty": faulty, "device": str(device)}


def run_job(*, device: str, timeout: float, backend: str = "inductor") -> dict[str, list[dict[str, Any]]]:
    """Every rank's findings per setup (rank order) on ``device`` (``cuda`` or ``cpu``); ``RankFailed`` if a rank
    fails or a job outlives what is left of ``timeout``."""
    import time

    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # before the ranks start: they inherit it
    deadline = time.monotonic() + timeout
    out = {}
    for setup in SETUPS:
        fsdp = setup != "compile(ddp)"
        world = 1 if fsdp else DDP_WORLD
        comm = "nccl" if fsdp and device == "cuda" else "gloo"
        left = deadline - time.monotonic()
        out[setup] = run_ranks(_rank_job, world, setup, backend, device, timeout=left, backend=comm)
    return out


def evaluate(rep: SectionReport, jobs: dict[str, list[dict[str, Any]]]) -> None:
    """The checks of the module docstring over every setup's findings."""
    for setup in SETUPS:
        ranks = jobs[setup]
        faulty_rank = FAULTY_RANK if setup == "compile(ddp)" else 0
        clean = [s for r in ranks for s in r["clean"]["steps"]]
        noisy = [s for s in clean if not s["commit"] or s["incidents"]]
        rep.check(f"{setup}: {STEPS} clean steps commit with no incident on every rank", not noisy, str(noisy[:1]))
        same = all(r["clean"]["fingerprints"] == r["plain"]["fingerprints"] for r in ranks)
        rep.check(f"{setup}: the guarded run's weights are the unguarded run's, bit for bit", same)
        run = sum(s["matmuls_run"] for r in ranks for s in r["clean"]["steps"])
        rep.check(f"{setup}: the checksums at their default leave compiled code alone", run == 0, f"{run} matmuls run")
        rep.check(f"{setup}: the fault was injected", ranks[faulty_rank]["faulty"]["injected"] > 0)
        at = [next(s for s in r["faulty"]["steps"] if s["step"] == FAULT_STEP) for r in ranks]
        named = [i for s in at for i in s["incidents"]]
        rep.check(f"{setup}: no rank commits the faulty step", not any(s["commit"] for s in at))
        rep.check(
            f"{setup}: the incident names rank {faulty_rank} alone",
            bool(named) and all(i["suspect_ranks"] == [faulty_rank] for i in named),
            str(named[:1]),
        )
        rep.measure(setup, {"device": ranks[0]["device"], "incident": named[0] if named else None})


def run(ctx: Context, rep: SectionReport) -> str | None:
    import torch

    rep.check("torch has torch.compile", hasattr(torch, "compile"), f"torch {torch.__version__}")
    ctx.require_gpu(
        f"train {' and '.join(SETUPS)} with inductor on cuda:0, with and without the guard (checksums at their "
        "default): bit-identical, then a fault named"
    )
    if not rep.check("torch sees CUDA", torch.cuda.is_available(), f"CUDA {torch.version.cuda}"):
        return None
    try:
        jobs = run_job(device="cuda", timeout=ctx.left())
    except RankFailed as e:
        rep.check("the compiled jobs finish", False, str(e).splitlines()[0])
        rep.say(str(e))
        return None
    evaluate(rep, jobs)
    return f"{' and '.join(SETUPS)} under the guard: bit-identical to the unguarded runs, the fault vetoed and named"
