"""The gradient's path into DDP's reduction (issue 47, :mod:`sdcguard.training.hooks.bucket`), over gloo in real
processes: a gradient changed by a ``param.register_hook`` registered after the guard's (lm-resiliency's gradient
noise and gradient drop: the guard's tap sees the clean gradient, DDP all-reduces the changed one, every replica
agrees) is vetoed on every rank at its step and names the changing rank alone (``reduction``), one-off (in a step of
one micro-batch, and in the first of two accumulated under ``no_sync``) and sticky, with 2 ranks (no vote is needed:
the rank sees the change itself) and 3 (with a comm hook of the user's own registered after the guard); a clean run,
with a user's hook registered before the guard, gradient accumulation, in-place zeroing and a group of 3 (whose
average DDP computes with the reciprocal), trains bit for bit as plain DDP with no incident. Under FSDP2 such a hook
on a parameter never runs: FSDP2 hands the sharded parameter its gradient directly, not through autograd, so the
fault changes nothing (shown here too)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from sdcguard import SDCGuard
from sdcguard.testing import run_ranks
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

pytestmark = pytest.mark.distributed

SEQ = 4
STEPS = 8
FAULTY = 1
NOISE_AT = 1  # one-off: one element of the gradient plus 1e-3
ACCUMULATED_AT = 3  # one-off, in the first of two micro-batches (under no_sync: DDP reduces only their sum)
DROP_FROM = 5  # sticky: the gradient zeroed from this step on


def _corrupting_hook(box: dict[str, int]) -> Any:
    def hook(grad: torch.Tensor) -> torch.Tensor | None:
        step = box["step"]
        box["calls"] += 1
        if step == NOISE_AT or (step == ACCUMULATED_AT and box["calls"] == 1):
            out = grad.clone()
            out.view(-1)[0] += 1e-3
            return out
        if step >= DROP_FROM:
            return torch.zeros_like(grad)
        return None

    return hook


def _fault_job(rank: int, world: int, wrapped: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    guard = SDCGuard(  # a plain module: guard.step wraps it in DDP, and watches that wrapper
        DDP(model) if wrapped else model,
        lm_loss,
        replay_every=0,
        weight_check_every=1,
        escalate="off",
        checksum_every=0,
        slow=None,
    )
    box = {"step": -1, "calls": 0}
    calls = {"n": 0}
    if wrapped:  # a comm hook of the user's own, registered after the guard: still called, the path still checked

        def user_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            calls["n"] += 1
            return allreduce_hook(state, bucket)

        guard.model.register_comm_hook(None, user_hook)
    target = next(p for p in model.parameters() if p.dim() == 2)
    if rank == FAULTY:  # after the guard's own tensor hook, as lm-resiliency's injector registers it
        target.register_hook(_corrupting_hook(box))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    for step in range(STEPS):
        box["step"], box["calls"] = step, 0
        mbs = [make_batch(step, rank * 2 + i, seq=SEQ) for i in range(2 if step == ACCUMULATED_AT else 1)]
        report = guard.step(step, micro_batches=mbs)
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        weights = guard.after_optimizer_step()
        seen.append(
            {
                "commit": report.commit,
                "incidents": [(i.kind, i.step, i.suspect_ranks, i.sticky) for i in report.incidents],
                "weights": [(i.kind, i.suspect_ranks) for i in weights],
                "checks": report.checks,
            }
        )
    guard.close()
    return {"seen": seen, "user_hook_calls": calls["n"]}


def _expect_named(results: list[dict[str, Any]], wrapped: bool) -> None:
    assert all((r["user_hook_calls"] > 0) is wrapped for r in results)
    seen = results[0]["seen"]
    assert all(r["seen"] == seen for r in results), "every rank decided alike"
    for step, e in enumerate(seen):
        assert "reduction" in e["checks"], e
        assert e["weights"] == [], e  # every replica reduced the same changed gradient: nothing to compare
        if step in (NOISE_AT, ACCUMULATED_AT) or step >= DROP_FROM:
            sticky = step > DROP_FROM  # named at the check before too: the change reproduced
            assert not e["commit"] and e["incidents"] == [("reduction", step, (FAULTY,), sticky)], (step, e)
        else:
            assert e["commit"] and e["incidents"] == [], (step, e)


@pytest.mark.timeout(120)
def test_noise_and_drop_after_the_guards_hook_are_vetoed_and_name_the_rank_with_two_ranks() -> None:
    _expect_named(run_ranks(_fault_job, 2, False, timeout=100), False)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_noise_and_drop_after_the_guards_hook_are_vetoed_and_name_the_rank_with_three_ranks() -> None:
    _expect_named(run_ranks(_fault_job, 3, True, timeout=100), True)


def _clean_job(rank: int, world: int, guarded: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    for p in model.parameters():  # a user's hook, registered before the guard: the replay applies it too
        p.register_hook(lambda g: g * 0.5)
    ddp = DDP(model)
    guard = SDCGuard(ddp, lm_loss, replay_every=1, escalate="off", checksum_every=0, slow=None) if guarded else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)
    checks = []
    for step in range(4):
        mbs = [make_batch(step, rank * 2 + i, seq=SEQ) for i in range(2 if step % 2 else 1)]
        if guard is not None:
            report = guard.step(step, micro_batches=mbs)
            assert report.commit and not report.incidents, report
            checks.append(report.checks)
        else:
            for i, mb in enumerate(mbs):
                with ddp.no_sync() if i < len(mbs) - 1 else nullcontext():
                    (lm_loss(ddp, mb) / len(mbs)).backward()
        opt.step()
        opt.zero_grad(set_to_none=step != 1)  # zeroed in place once: .grad holds zeros the gradient is added to
        if guard is not None:
            guard.after_optimizer_step()
    return {"weights": [p.detach().numpy().tobytes() for p in model.parameters()], "checks": checks}


@pytest.mark.timeout(200)
def test_a_clean_run_trains_bit_for_bit_as_plain_ddp_with_no_incident() -> None:
    plain = run_ranks(_clean_job, 3, False, timeout=90)
    guarded = run_ranks(_clean_job, 3, True, timeout=90)
    for a, b in zip(plain, guarded):
        assert a["weights"] == b["weights"]  # bit for bit
        assert all("reduction" in c for c in b["checks"]), b["checks"]


def _fsdp_job(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    guard = SDCGuard(model, lm_loss, replay_every=1, escalate="off", checksum_every=0, slow=None)
    calls = {"n": 0}

    def hook(grad: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return torch.zeros_like(grad)

    for p in model.parameters():  # lm-resiliency's gradient drop, on every parameter of this rank
        if rank == FAULTY:
            p.register_hook(hook)
    report = guard.step(0, make_batch(0, rank, seq=SEQ))
    return {"calls": calls["n"], "commit": report.commit, "incidents": len(report.incidents)}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_under_fsdp2_a_hook_on_a_parameter_never_runs() -> None:
    for r in run_ranks(_fsdp_job, 2, timeout=100):
        assert r == {"calls": 0, "commit": True, "incidents": 0}, r
