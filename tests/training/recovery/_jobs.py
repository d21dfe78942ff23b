"""The jobs the recovery tests run on gloo ranks: a guarded loop with ``escalate="recover"`` and a sticky fault,
and the fault-free references it must equal bit for bit (plain DDP loops, no guard)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sdcguard import SDCGuard, plan_roles
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode, corrupt_weights_
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

SEQ = 4
STEPS = 10


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _batch(step: int, data_rank: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(1000 * step + data_rank)  # dropout's stream: a function of the step and the data rank
    return make_batch(step, data_rank, seq=SEQ)


def _final(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    state = opt.state_dict()["state"]
    return {
        "weights": [p.detach().numpy().tobytes() for p in model.parameters()],
        "optimizer": {k: {n: t.numpy().tobytes() for n, t in v.items()} for k, v in state.items()},
    }


def train(
    guard: SDCGuard,
    opt: torch.optim.Optimizer,
    start: int = 0,
    *,
    steps: int = STEPS,
    before: Callable[[int], contextlib.AbstractContextManager[object]] = lambda step: contextlib.nullcontext(),
    resumed: Callable[[int, int], None] = lambda step, resume: None,
) -> None:
    """The loop of docs/recovery.md from ``start`` to ``steps``: ``guard.step`` inside ``before(step)`` (a fault
    injector), the same batches again from ``report.resume_from`` after a recovery (``resumed(step, resume)`` told),
    the optimizer step where the guard commits."""
    step = start
    while step < steps:
        with before(step):
            report = guard.step(step, _batch(step, guard.data_rank))
        if report.resume_from is not None:
            resumed(step, report.resume_from)
            step = report.resume_from
            continue
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        guard.after_optimizer_step()
        step += 1


def recovering(
    rank: int, world: int, spares: int, fault: tuple[int, int], min_replicas: int | None, *,
    escalate: str = "recover", verdicts: str | None = None, replay_every: int | None = None, memory: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """A sticky fault on rank ``fault[0]`` from step ``fault[1]`` on (``memory``: instead, one element of a weight
    flipped in its memory before that step); returns how the rank ended (``verdicts``: a folder where each rank's
    verdict file goes)."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    if verdicts is not None:
        os.environ["SDCGUARD_VERDICT_FILE"] = os.path.join(verdicts, f"rank{rank}.jsonl")
    roles = plan_roles(spares) if spares else None
    model, opt = _model()
    every = replay_every if replay_every is not None else (1 if spares else 2)
    kw: dict[str, Any] = dict(
        group=roles.dp_group if roles else None, shadows=list(roles.shadows) if roles else "peer",
        replay_every=every, weight_check_every=1, checksum_every=0, slow=None, optimizer=opt,
        escalate=escalate, min_replicas=min_replicas,
    )  # fmt: skip
    injector = OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5), ops="gelu", phase="forward",
        rank=fault[0], steps=range(fault[1], STEPS),
    )  # fmt: skip
    resumes = []
    try:
        if roles is not None and roles.role == "shadow":
            guard = SDCGuard(model, lm_loss, **kw)
            guard.serve()
            if guard.role != "worker":
                return {"role": "shadow"}
            step = guard.resume_from
        else:
            guard = SDCGuard(DDP(model, process_group=kw["group"]), lm_loss, **kw)
            step = 0
        flipped = False

        def before(step: int) -> contextlib.AbstractContextManager[object]:
            nonlocal flipped
            injector.step = step
            if memory and rank == fault[0] and step == fault[1] and not flipped:
                corrupt_weights_(model, Fault(pattern="bitflip", bit=30, elements=1, seed=7), names="*fc1.weight")
                flipped = True
            return injector if rank == fault[0] and not memory else contextlib.nullcontext()

        train(guard, opt, step, before=before, resumed=lambda step, resume: resumes.append((step, resume)))
        guard.close()
    except SystemExit as e:
        return {"exit": e.code}
    recovered = [i for i in guard.incidents if i.recovered_step is not None]
    return {
        "data_rank": guard.data_rank,
        "resumes": resumes,
        "role": "worker",
        "recovered": [
            (i.kind, i.suspect_ranks, i.recovered_step, i.steps_lost, i.replacement_device) for i in recovered
        ],  # fmt: skip
        "seconds": [i.recovery_s for i in recovered],
        **_final(model, opt),
    }


def fault_free(rank: int, world: int, leaves_at: int | None) -> dict[str, Any]:
    """Plain DDP, no guard: ``world`` replicas throughout, or (``leaves_at``) rank 1 leaving before that step and
    the others going on as a smaller job from the same state (a new DDP over the new group, warmed as a resumed
    job's would be), data ranks numbered by place."""
    model, opt = _model()
    ddp: torch.nn.Module = DDP(model)
    data_rank = rank
    for step in range(STEPS):
        if step == leaves_at:
            group = dist.new_group([0, 2])
            ddp.reducer._remove_autograd_hooks()
            if rank == 1:
                return {"role": "left"}
            ddp, data_rank = DDP(model, process_group=group), [0, 2].index(rank)
            cpu = torch.get_rng_state()
            lm_loss(ddp, _batch(step, data_rank)).backward()  # the warm-up: DDP buckets as a fault-free run's
            torch.set_rng_state(cpu)
            opt.zero_grad(set_to_none=True)
        lm_loss(ddp, _batch(step, data_rank)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"data_rank": data_rank, **_final(model, opt)}
