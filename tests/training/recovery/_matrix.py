"""The attribution matrix's ``recover`` column (tests/training/verdicts/test_attribution_matrix.py): one cell is a
real job (gloo processes) with ``escalate="recover"``, ``min_replicas=1``, in peer mode or with one dedicated shadow
as a spare, and sticky faults on one or two workers (worker 1 from step 4; with two, the last worker, or worker 0 of
two, from step 7). Every rank returns how it ended and, for a worker that finished, the recoveries it went through
(the step each went on from, and the new group) and the digest of its final state; :func:`reference` replays the
same membership without faults, so the cell's survivors can be compared with it bit for bit."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sdcguard import SDCGuard, plan_roles
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing.models import lm_loss
from sdcguard.training.recovery.snapshot import snapshot_fingerprints
from sdcguard.training.recovery.state import LiveState, state_digest
from tests.training.recovery._jobs import _batch, _model, train

STEPS = 12


def faults(workers: int, count: int) -> dict[int, int]:
    """Faulty worker -> the step its sticky fault starts at."""
    out = {1: 4}
    if count == 2:
        out[workers - 1 if workers > 2 else 0] = 7
    return out


def _digest(model: torch.nn.Module, opt: Any) -> int:
    skeleton, live = LiveState(model, opt).read()
    return state_digest(snapshot_fingerprints(live), skeleton)


def recover_cell(rank: int, world: int, kind: str, count: int) -> dict[str, Any]:
    """One rank of a cell (``kind``: ``peer``, or ``shadow``: the last rank a dedicated shadow)."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    roles = plan_roles(1) if kind == "shadow" else None
    workers = world - 1 if roles else world
    model, opt = _model()
    kw: dict[str, Any] = dict(
        group=roles.dp_group if roles else None, shadows=list(roles.shadows) if roles else "peer",
        replay_every=1 if roles else 2, weight_check_every=1, checksum_every=0, slow=None, optimizer=opt,
        escalate="recover", min_replicas=1,
    )  # fmt: skip
    start = faults(workers, count).get(rank)
    fault = None if start is None else OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5 + rank), ops="gelu", phase="forward",
        rank=rank, steps=range(start, STEPS),
    )  # fmt: skip
    timeline: list[tuple[int, tuple[int, ...]]] = []
    try:
        if roles is not None and roles.role == "shadow":
            guard = SDCGuard(model, lm_loss, **kw)
            guard.serve()
            if guard.role != "worker":
                return {"ended": "shadow"}
            step = guard.resume_from or 0
            timeline.append((step, tuple(guard.members)))
        else:
            guard = SDCGuard(DDP(model, process_group=kw["group"]), lm_loss, **kw)
            step = 0

        def before(step: int) -> contextlib.AbstractContextManager[object]:
            if fault is None:
                return contextlib.nullcontext()
            fault.step = step
            return fault

        def resumed(step: int, resume: int) -> None:
            timeline.append((resume, tuple(guard.members)))

        train(guard, opt, step, steps=STEPS, before=before, resumed=resumed)
        guard.close()
    except SystemExit as e:
        return {"ended": e.code}
    return {"ended": "finished", "timeline": timeline, "digest": _digest(model, opt), "data_rank": guard.data_rank}


def reference(rank: int, world: int, workers: int, timeline: list[tuple[int, tuple[int, ...]]]) -> int | None:
    """The cell's run without faults: plain DDP over the first ``workers`` ranks, then over each group of
    ``timeline`` from its step on (data ranks numbered by place, a new DDP warmed as the recovery warms it); the
    digest of this rank's final state (None: not in the last group)."""
    model, opt = _model()
    segments = [(0, tuple(range(workers))), *timeline]
    groups = [None if list(m) == list(range(world)) else dist.new_group(sorted(m)) for _, m in segments]
    ddp: Any = None
    for step in range(STEPS):
        k = max(i for i, (s, _) in enumerate(segments) if s <= step)
        for i in [i for i, (s, _) in enumerate(segments) if i > 0 and s == step]:  # each recovery that went on here
            source = next(r for r in segments[i][1] if r in segments[i - 1][1])  # a member that kept the state
            box = [(model.state_dict(), opt.state_dict()) if rank == source else None]
            dist.broadcast_object_list(box, src=source)  # a promoted spare starts from it, as the heal gives it
            if rank in segments[i][1] and rank not in segments[i - 1][1]:
                model.load_state_dict(box[0][0])
                opt.load_state_dict(box[0][1])
            if ddp is not None:
                ddp.reducer._remove_autograd_hooks()
                ddp = None
            if rank in segments[i][1]:
                ddp = DDP(model, process_group=groups[i]) if len(segments[i][1]) > 1 else model
                cpu = torch.get_rng_state()
                lm_loss(ddp, _batch(step, segments[i][1].index(rank))).backward()  # the warm-up
                torch.set_rng_state(cpu)
                opt.zero_grad(set_to_none=True)
        members = segments[k][1]
        if rank not in members:
            continue
        if ddp is None:
            ddp = DDP(model, process_group=groups[0])
        lm_loss(ddp, _batch(step, members.index(rank))).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _digest(model, opt) if rank in segments[-1][1] else None
