"""The guard in real multi-process DDP jobs over gloo: flipped bits in one op's output on one rank are detected at
that step, attributed to that rank and committed by no rank; sticky faults too; clean runs stay silent; both
shadow modes.

Each job runs many faults at different steps (one process start for a whole grid of op x bit class), so the
suite stays cheap on a two-core machine.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from _dist import run_ranks
from _tiny_transformer import TinyTransformer, lm_loss, make_batch
from sdcguard.guard import SDCGuard
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode, corrupt_tensor_, corrupt_weights_
from sdcguard.shadows import plan_roles
from sdcguard.store import Store

pytestmark = pytest.mark.distributed

OPS = ("matmul", "native_layer_norm", "_softmax", "gelu", "embedding", "nll_loss_forward")
BITS = ("sign", "exponent", "high_mantissa", "low_mantissa")
# Softmax outputs above the causal diagonal are exact zeros that multiply into nothing: a flip there is harmless
# and invisible, so softmax faults pick a probability that matters.
RANGES = {"_softmax": (1e-6, 2.0)}

Plan = tuple[int, int, str, str, str]  # (step, rank, op, bit class, timing)


def _outcome(report: Any) -> tuple[bool, list[tuple[str, int, tuple[int, ...], bool | None, str | None]]]:
    return report.commit, [(i.kind, i.step, i.suspect_ranks, i.sticky, i.parameter) for i in report.incidents]


def _job(
    rank: int, world: int, plans: list[Plan], steps: int, shadows: int, extras: dict[str, Any], size: dict[str, int]
) -> dict[str, Any]:
    """One rank of a training job. ``shadows``: 0 for peer mode, else the number of dedicated shadows."""
    torch.manual_seed(0)
    model = TinyTransformer(**size)
    if shadows:
        roles = plan_roles(shadows)
        wrapped = DDP(model, process_group=roles.dp_group) if roles.role == "worker" else model
        guard = SDCGuard(wrapped, lm_loss, group=roles.dp_group, replay_every=1, shadows=list(roles.shadows),
                         weight_check_every=1)
    else:
        guard = SDCGuard(DDP(model), lm_loss, replay_every=1, weight_check_every=1, store=extras.get("store"))
    modes = {
        s: OpFaultMode(Fault(pattern="bitflip", bit=bit, timing=timing, seed=s, value_range=RANGES.get(op)),
                       ops=op, phase="forward", rank=r, steps=[s] if r != extras.get("shadow_rank") else None)
        for s, r, op, bit, timing in plans
    }
    if guard.role == "shadow":
        mine = [m for m in modes.values() if m.rank == rank]
        with mine[0] if mine else nullcontext():
            served = guard.serve()
        return {"served": served, "changed": sum(len(m.records) for m in mine)}

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(100 + rank)  # each rank's dropout stream differs, as in a real job
    calibration = guard.calibrate(make_batch(0, rank, seq=size.get("seq", 8)))
    out: dict[int, Any] = {}
    for step in range(steps):
        mode = modes.get(step)
        if mode is not None and mode.rank == extras.get("shadow_rank"):
            mode = None
        if step == extras.get("reduced_grad_step") and rank == extras["reduced_grad_rank"]:
            _corrupt_next_reduction(guard)
        if mode is not None:
            mode.step = step
        with mode if mode is not None else nullcontext():
            report = guard.step(step, make_batch(step, rank, seq=size.get("seq", 8)))
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if step == extras.get("weight_step"):
            corrupt_weights_(model, Fault(pattern="bitflip", bit="high_mantissa", timing="transient"),
                             rank=extras["weight_rank"])
        weight_incidents = guard.after_optimizer_step()
        out[step] = (*_outcome(report), [(i.kind, i.step, i.suspect_ranks) for i in weight_incidents])
    closing = guard.close()
    return {
        "steps": out,
        "closing": [(i.kind, i.step, i.suspect_ranks, i.sticky, i.parameter) for i in closing],
        "changed": {s: len(m.records) for s, m in modes.items() if m.rank == rank},
        "total": len(guard.incidents),
        "calibration": (calibration.deterministic, calibration.same_device, calibration.cross_rank),
    }


def _corrupt_next_reduction(guard: SDCGuard) -> None:
    """Make this rank's next gradient all-reduce come back with one flipped bit (a faulty link or memory)."""
    real = guard._all_reduce

    def faulty(grads: list[torch.Tensor]) -> list[torch.Tensor]:
        out = real(grads)
        corrupt_tensor_(out[2], Fault(pattern="bitflip", bit="low_mantissa", timing="transient"))
        guard._all_reduce = real  # type: ignore[method-assign]
        return out

    guard._all_reduce = faulty  # type: ignore[method-assign]


def _grid() -> list[tuple[str, str]]:
    return list(itertools.product(OPS, BITS))


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_peer_replay_stays_silent_when_clean_and_catches_every_single_bit_flip(tmp_path: Path) -> None:
    """200 clean steps (no incident, every step committed), then a grid of faults, one every other step."""
    world, clean = 3, 200
    plans: list[Plan] = []
    step = clean + 1
    for i, (op, bit) in enumerate(_grid()):  # transient: one flipped bit in one op call
        plans.append((step, i % world, op, bit, "transient"))
        step += 2  # a clean step between faults: no false alarm, no lingering effect
    for i, op in enumerate(OPS):  # sticky: every computation of that op on that rank during the step
        plans.append((step, (i + 1) % world, op, BITS[i % len(BITS)], "sticky"))
        step += 2
    db = tmp_path / "fleet.db"
    extras = {"reduced_grad_step": step, "reduced_grad_rank": 2, "weight_step": step + 2, "weight_rank": 1,
              "store": str(db)}
    results = run_ranks(_job, world, plans, step + 3, 0, extras, {"d": 8, "heads": 2, "seq": 4}, timeout=260)

    assert all(res["calibration"] == (True, True, True) for res in results)  # replays are bit-identical here
    with Store.open(db, create=False) as store:  # the group's first rank recorded every incident, once
        assert len(store.incidents()) == results[0]["total"] == len(plans) + 2
    for res in results:
        assert all(res["steps"][s] == (True, [], []) for s in range(clean)), "a clean step raised an incident"
    for s, r, op, bit, timing in plans:
        assert results[r]["changed"][s] >= 1, f"the injector changed nothing for {op}/{bit}"
        for rank, res in enumerate(results):
            commit, incidents, _ = res["steps"][s]
            assert not commit, f"rank {rank} committed step {s} ({op}, {bit}, {timing})"
            assert [(k, st, sus) for k, st, sus, _, _ in incidents] == [("replay", s, (r,))], (op, bit, timing, incidents)
            assert incidents[0][3] is (timing == "sticky"), (op, bit, timing, incidents)
            if op != "nll_loss_forward":  # a flipped loss value changes the loss, not the gradients
                assert incidents[0][4] is not None
    faulty = {p[0] for p in plans} | {extras["reduced_grad_step"]}
    for s in range(clean, step):
        if s not in faulty:
            assert all(res["steps"][s][:2] == (True, []) for res in results), s

    g = extras["reduced_grad_step"]
    for res in results:
        commit, incidents, _ = res["steps"][g]
        assert not commit and [(k, sus) for k, _, sus, _, _ in incidents] == [("gradient_replica", (2,))]
    w = extras["weight_step"]
    assert all(res["steps"][w][2] == [("weight_replica", w, (1,))] for res in results)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dedicated_shadow_replays_while_workers_go_on_and_names_the_faulty_rank() -> None:
    world, shadow = 4, 3  # three workers, one dedicated shadow
    # With replay_every=1, sample s is worker s % 3's micro-batch; a fault is planted where it will be replayed.
    plans: list[Plan] = [
        (0, shadow, "gelu", "exponent", "transient"),  # the shadow itself computes its first replay wrong
        (2, 2, "matmul", "sign", "transient"),
        (4, 1, "native_layer_norm", "low_mantissa", "transient"),
        (6, 0, "embedding", "high_mantissa", "sticky"),
        (8, 2, "nll_loss_forward", "low_mantissa", "transient"),  # the last sample: settled in close()
    ]
    results = run_ranks(_job, world, plans, 9, 1, {"shadow_rank": shadow}, {}, timeout=220)
    assert results[shadow]["served"] == 9 and results[shadow]["changed"] >= 1
    workers = results[:3]
    assert all(res["calibration"] == (True, True, True) for res in workers)
    expected = [("replay", 0, (shadow,)), ("replay", 2, (2,)), ("replay", 4, (1,)), ("replay", 6, (0,)),
                ("replay", 8, (2,))]
    for res in workers:
        steps = res["steps"]
        # A verdict arrives while the workers go on: reported at a later step (or in close()), naming its step.
        seen = [(at, (k, st, sus)) for at in range(9) for k, st, sus, _, _ in steps[at][1]]
        seen += [(9, (k, st, sus)) for k, st, sus, _, _ in res["closing"]]
        assert sorted(inc for _, inc in seen) == expected
        assert all(at > inc[1] for at, inc in seen), seen
        assert all(commit for commit, _, _ in steps.values())  # nothing vetoed after the fact
        assert res["total"] == 5
    # every worker learns each verdict at the same step (one collective decides)
    per_step = [[incidents for _, incidents, _ in res["steps"].values()] for res in workers]
    assert per_step[1] == per_step[0] and per_step[2] == per_step[0]
    for s, r, *_ in plans[1:]:
        assert workers[r]["changed"][s] >= 1
