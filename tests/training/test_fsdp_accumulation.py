"""FSDP2 gradient accumulation without gradient sync, and shard groups of one rank, over gloo (3 ranks): the sampled
micro-batch is judged on its own gradients as autograd produced them (the reduce-scatter only ever sees the sum).

A raw FSDP2 loop makes the four calls and turns sync off for every micro-batch but the last, as torchtitan and
Accelerate do. With ``replay_every=1`` and three micro-batches the sampled micro-batch rotates 0, 1, 2, 0: the
accumulated ones are sampled and judged. What a user relies on: a clean run commits every step with no incident and
no "not judged" warning, every step is verified, and its weights are bit for bit those of the same loop without
the guard; a one-off fault in a non-last micro-batch (forward or backward) on one rank is named at its step and no
rank commits that step. The same holds for HSDP with a shard group of one rank (three replicas), which FSDP2 reduces
without any reduce-scatter.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

import pytest
import torch

from sdcguard import SDCGuard
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing import run_ranks
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from tests._logs import logged

pytestmark = pytest.mark.distributed

SEQ = 4
MICRO = 3
STEPS = 4
FAULTY = (1, 1)
"""(step, rank): step 1 samples micro-batch 1 (of 0, 1, 2), accumulated with sync off."""


def _model(kind: str, world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=2)
    if kind == "hsdp-1":  # three replicas of one shard: FSDP2 all-reduces, it never reduce-scatters
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _train(rank: int, model: torch.nn.Module, guard: SDCGuard | None, fault: tuple[str, str] | None) -> list[Any]:
    """``STEPS`` steps of ``MICRO`` micro-batches, sync on the last only; the step reports (None without guard)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)  # each rank's dropout stream differs, as in a real job
    out: list[Any] = []
    for step in range(STEPS):
        if guard is not None:
            guard.begin_step(step, micro_batches=MICRO)
        for i in range(MICRO):
            model.set_requires_gradient_sync(i == MICRO - 1)
            batch = make_batch(step, rank * MICRO + i, seq=SEQ)
            mode = None
            if fault is not None and (step, i) == (FAULTY[0], step % MICRO):
                op, phase = fault
                mode = OpFaultMode(
                    Fault(pattern="bitflip", bit="high_mantissa", timing="transient", seed=step),
                    ops=op, phase=phase, rank=FAULTY[1], steps=[step],
                )  # fmt: skip
                mode.step = step
            with mode if mode is not None else nullcontext():
                if guard is not None:
                    guard.before_forward(batch)
                loss = lm_loss(model, batch)
                if guard is not None:
                    guard.observe_loss(loss)
                (loss / MICRO).backward()
        report = guard.end_step() if guard is not None else None
        if report is None or report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None:
            assert report is not None
            out.append((report.commit, [(i.kind, i.step, i.suspect_ranks) for i in report.incidents], report.replayed))
    return out


def _weights(model: torch.nn.Module) -> list[float]:
    return [float(x) for p in model.parameters() for x in p.to_local().detach().reshape(-1)]


def _guarded(rank: int, world: int, kind: str, fault: tuple[str, str] | None) -> dict[str, Any]:
    model = _model(kind, world)
    guard = SDCGuard(model, lm_loss, replay_every=1, weight_check_every=0, checksum_every=0, escalate="off")
    with logged() as said:
        steps = _train(rank, model, guard, fault)
    guard.close()
    return {
        "steps": steps,
        "weights": _weights(model),
        "unjudged": any("not judged" in m for m in said),
        "verified": guard.last_verified_step,
    }


def _job(rank: int, world: int, kind: str, fault: tuple[str, str]) -> dict[str, Any]:
    """The loop without the guard, with it, and with it and a fault (one process group for the three)."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    plain = _model(kind, world)
    _train(rank, plain, None, None)
    return {
        "plain": _weights(plain),
        "clean": _guarded(rank, world, kind, None),
        "fault": _guarded(rank, world, kind, fault),
    }


def _clean(results: list[dict[str, Any]]) -> None:
    for res in results:
        clean = res["clean"]
        assert clean["steps"] == [(True, [], True)] * STEPS
        assert not clean["unjudged"]
        assert clean["verified"] == STEPS - 1  # every sample, accumulated ones included, judged and clean
        assert clean["weights"] == res["plain"]  # the guard is an observer: the unguarded loop's weights, bit for bit


def _named(results: list[dict[str, Any]]) -> None:
    step, rank = FAULTY
    steps = [res["fault"]["steps"] for res in results]
    for seen in steps:
        commit, incidents, _ = seen[step]
        assert not commit and incidents == [("replay", step, (rank,))], seen
        assert all(c and not i for s, (c, i, _) in enumerate(seen) if s != step), seen
    assert all(seen == steps[0] for seen in steps)  # every rank decides alike


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "kind, fault",
    [
        ("fsdp", ("mm", "backward")),  # plain FSDP2: the reduce-scatter sees the sum of the micro-batches
        ("hsdp-1", ("gelu", "forward")),  # a shard group of one rank: no reduce-scatter at all
    ],
)
def test_accumulated_samples_are_judged_clean_runs_bit_identical_and_a_fault_named(
    kind: str, fault: tuple[str, str]
) -> None:
    results = run_ranks(_job, 3, kind, fault, timeout=130)
    _clean(results)
    _named(results)
