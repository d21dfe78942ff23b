"""A tiny pipeline-parallel job for the stage tests: an MLP in two stages (``torch.distributed.pipelining``,
``ScheduleGPipe``, two micro-batches a step), each stage's replicas reducing their gradients over the mesh's ``dp``
dimension by hand after the schedule (DDP around a stage does not keep the last stage's replicas in sync in torch
2.13: they drift apart, which the guard names every step), with the guard watching each stage
(``sdcguard.adapters.pipelining.watch_stage``) and faults at (rank, step): one stage's weight gradient (sticky or
once), its forward output."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests._tensor_parallel import ShapeFault

MICRO = 2


def _stages() -> list[nn.Module]:
    torch.manual_seed(0)
    full = [nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 24), nn.GELU(), nn.Linear(24, 4)]
    return [nn.Sequential(*full[:2]), nn.Sequential(*full[2:])]


def job(
    rank: int,
    world: int,
    dp: int,
    guarded: bool,
    fault: dict[str, Any] | None,
    steps: int,
    schedule_name: str = "gpipe",
    checksum_every: int = 0,
) -> dict[str, Any]:
    """``fault``: ``{"kind": "dw" | "forward" | "memory", "rank": r, "step": s, "times": n | None}`` (dw: the last
    stage's first layer's weight gradient, a (24, 16) matmul of its backward; memory: one element of the stage's
    first weight flipped in the faulty rank's memory before step ``s``). The faulty device stays faulty for the whole
    step (a sticky fault also corrupts the guard's replays and reruns on it: the injector is entered before the
    guard's own modes, so the matmul checksums see what it corrupts). ``schedule_name``: ``gpipe`` or ``1f1b``."""
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    import sdcguard
    from sdcguard.adapters.pipelining import watch_stage
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode, corrupt_weights_

    pp = world // dp
    mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp", "pp"))
    d, s = mesh.get_coordinate()
    part = _stages()[s]
    model = part
    stage = PipelineStage(model, s, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = kind(stage, n_microbatches=MICRO, loss_fn=lambda out, y: F.cross_entropy(out, y))
    opt = torch.optim.SGD(part.parameters(), lr=0.1)
    guard = None
    if guarded:
        guard = sdcguard.SDCGuard(
            model,
            sdcguard.stage_output,
            mesh=mesh,
            replay_every=1,
            checksum_every=checksum_every,
            weight_check_every=1,
            escalate="off",
        )
        watch_stage(guard, stage)
    mode: Any = None
    if fault is not None and fault["kind"] == "dw":
        mode = ShapeFault((24, 16), fault["rank"], fault["step"], fault.get("times"))
    elif fault is not None and fault["kind"] == "forward":
        timing = "sticky" if fault.get("times") is None else "transient"
        mode = OpFaultMode(
            Fault(pattern="bitflip", bit="exponent", timing=timing),
            ops="addmm",
            phase="forward",
            rank=fault["rank"],
            steps=[fault["step"]],
        )
    seen = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + d)
        x, y = torch.randn(4 * MICRO, 8, generator=g), torch.randint(0, 4, (4 * MICRO,), generator=g)
        if mode is not None:
            mode.step = step
        if fault is not None and fault["kind"] == "memory" and step == fault["step"]:
            flip = Fault(pattern="bitflip", bit=30, elements=1, seed=7)
            corrupt_weights_(part, flip, rank=fault["rank"], names="0.weight")
        commit = True
        # The device is faulty for the whole step: below every mode the guard enters (the checksums see what it
        # corrupts), and still when the guard replays and reruns on it. Neither fault touches the reduction.
        with mode if mode is not None else _nothing():
            if guard is not None:
                guard.begin_step(step, micro_batches=MICRO)
            if s == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=[])
            for p in part.parameters():  # the stage's data-parallel reduction
                if p.grad is not None and dp > 1:
                    dist.all_reduce(p.grad, group=mesh["dp"].get_group())
                    p.grad /= dp
            if guard is not None:
                report = guard.end_step()
                commit = report.commit
                entry = {"commit": commit, "checks": report.checks, "incidents": _said(report.incidents)}
        if commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None:
            entry["weights"] = _said(guard.after_optimizer_step())
            seen.append(entry)
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in part.parameters()], "stage": s}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _said(incidents: Any) -> list[tuple[str, int, tuple[int, ...]]]:
    return [(i.kind, i.step, tuple(i.suspect_ranks)) for i in incidents]


def four_calls(rank: int, world: int, by: str, watched: bool, steps: int = 2) -> list[Any] | str:
    """Two stages x 2 replicas making the four calls around the schedule themselves, the guard given the mesh
    (``by="mesh"``) or a group per stage (``by="group"``), with ``watch_stage`` or without it (``watched``). Returns
    each step's (commit, incidents), or the error's one line."""
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    import sdcguard
    from sdcguard.adapters.pipelining import watch_stage
    from sdcguard.errors import BadInput

    dp = pp = 2
    mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp", "pp"))
    d, s = mesh.get_coordinate()
    part = _stages()[s]
    stage = PipelineStage(part, s, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=lambda out, y: F.cross_entropy(out, y))
    where: dict[str, Any] = {"mesh": mesh} if by == "mesh" else {"group": mesh["dp"].get_group()}
    guard = sdcguard.SDCGuard(part, sdcguard.stage_output, replay_every=1, escalate="off", **where)
    if watched:
        watch_stage(guard, stage)
    seen: list[Any] = []
    try:
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * step + d)
            x, y = torch.randn(4 * MICRO, 8, generator=g), torch.randint(0, 4, (4 * MICRO,), generator=g)
            guard.begin_step(step, micro_batches=MICRO)
            if not watched:  # what a loop without watch_stage can hand over: the pipeline's batch
                guard.before_forward(x)
            schedule.step(x) if s == 0 else schedule.step(target=y, losses=[])
            for p in part.parameters():
                dist.all_reduce(p.grad, group=mesh["dp"].get_group())
                p.grad /= dp
            report = guard.end_step()
            seen.append((report.commit, _said(report.incidents)))
    except BadInput as e:
        return str(e)
    return seen
