"""The step's checks of one guard, made from where it stands in the job: at construction, and again in the group a
recovery re-formed (:meth:`~.guard.SDCGuard.regroup`). Split from :mod:`.guard` by job: what is made here is
made the same way both times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..errors import BadInput
from .checksums.mode import ChecksumMode
from .checksums.round import ChecksumCheck
from .comm import Comm
from .hooks.ddp import ParamTaps
from .hooks.taps import Taps
from .identity import JobView
from .local.finite import NonFiniteCheck
from .local.memory import MemoryCheck
from .local.reduction import ReductionCheck
from .mesh import Layout
from .replay.recompute import Replayer
from .replica import GradientReplicaCheck, ReplicaPhases, WeightCheck
from .response import Responder
from .rounds.peer import PeerRound
from .rounds.round import Round, RoundCheck
from .rounds.shadows import DedicatedRound
from .step_check import StepCheck
from .timing import IdleClock, PhaseClock, SlowJudge, SlowWatch, TimingCheck
from .verdicts.attribution import Attributor
from .verdicts.outcomes import Outcomes

__all__ = ["Checks", "Where", "make_checks"]


@dataclass(frozen=True, kw_only=True)
class Where:
    """Where a guard stands, as its checks need it."""

    job_comm: Comm
    """The group of the step's gather."""
    comm: Comm
    """This rank's data-parallel group."""
    layout: Layout
    shadow_ranks: tuple[int, ...]
    identities: dict[int, tuple[str | None, str]]
    setups: dict[int, tuple[str, ...]]
    job: str
    device: torch.device
    record_ops: bool
    """Settling reruns may run under the op recorder (:meth:`~.guard.SDCGuard` decides)."""


@dataclass(frozen=True, kw_only=True)
class Checks:
    """The checks of the step, in the order their columns are computed and their results concluded."""

    replica: ReplicaPhases
    weights: WeightCheck
    round: RoundCheck
    checksums: ChecksumCheck
    memory: MemoryCheck
    slow: SlowJudge | None
    all: list[StepCheck]


def make_checks(
    where: Where,
    view: JobView,
    classes: list[int],
    *,
    taps: Taps,
    params: list[nn.Parameter],
    frozen: Sequence[tuple[str, nn.Parameter]],
    module: nn.Module,
    replayer: Replayer,
    attr: Attributor,
    outcomes: Outcomes,
    responder: Responder,
    clock: PhaseClock,
    slow: SlowWatch | None,
    rows: int,
    splits: int,
    log: logging.LoggerAdapter[logging.Logger],
    ddp: DistributedDataParallel | None = None,
) -> Checks:
    """The checksums (their mode is popped first: no replay runs under it), each rank's own shards against their
    fingerprint from after the optimizer step, non-finite losses and gradients, the gradients' path into ``ddp``'s
    reduction (the model's DDP wrapper, watched from now on), the reduced gradients across replicas, the sampled
    round, and the timing of slow ranks when timed."""
    job_ranks = list(where.job_comm.members)
    rank_keys = view.keys(job_ranks)
    if len({len(k) for k in rank_keys}) > 1:
        raise BadInput("the ranks' parameters are sharded differently (their DTensor placements differ)")
    ids = [(g, *where.identities.get(g, (None, ""))) for g in job_ranks]
    replica = ReplicaPhases(where.job_comm, rank_keys, taps.param_names, ids, where.job, classes[: len(params)])
    names = [*taps.param_names, *(f"{name} (frozen)" for name, _ in frozen)]
    frozen_weights = [p.detach() for _, p in frozen]
    weights = WeightCheck(
        ReplicaPhases(where.job_comm, rank_keys, names, ids, where.job, classes), taps.weights, frozen_weights
    )
    memory = MemoryCheck(
        lambda: [*taps.weights(), *frozen_weights], names, ids, where.job, where.device, index=where.job_comm.index
    )
    finite = NonFiniteCheck(taps.reduced, ids, where.job, where.device)
    speaks = where.job_comm.index == 0
    watch = taps.reduction if isinstance(taps, ParamTaps) else None
    if watch is not None and ddp is not None and not watch.watch(ddp) and speaks:
        log.warning("the gradients' path into DDP's all-reduce is not checked: %s", watch.refused)
    reduction = ReductionCheck(watch, taps.param_names, ids, where.job, where.device)
    rnd = RoundCheck(_make_round(where, taps, params, replayer, attr), outcomes, where.device, log, speaks=speaks)
    escalate: Callable[..., None] | None = rnd.round.escalate if where.shadow_ranks else None
    if escalate is not None:  # an escalation reaches the dedicated shadows too (they raise or exit alike)
        responder.before_acting = escalate
    checksums = ChecksumCheck(ChecksumMode(module, rows=rows, splits=splits), where.job_comm, attr, where.device)
    judge = (
        SlowJudge(
            slow, job_ranks, where.identities, job=where.job, job_size=len(view.ranks), slices=where.layout.slices
        )
        if slow is not None and not isinstance(clock, IdleClock)
        else None
    )
    checks: list[StepCheck] = [
        checksums,
        memory,
        finite,
        reduction,
        GradientReplicaCheck(replica, taps.reduced, where.device),
        rnd,
    ]
    if judge is not None:
        checks.append(TimingCheck(clock, judge, where.device))
    return Checks(
        replica=replica, weights=weights, round=rnd, checksums=checksums, memory=memory, slow=judge, all=checks
    )


def _make_round(where: Where, taps: Taps, params: list[nn.Parameter], replayer: Replayer, attr: Attributor) -> Round:
    if where.shadow_ranks:
        return DedicatedRound(where.comm, where.shadow_ranks, params, replayer, attr)
    collective = taps.collective_replay or where.layout.meshed
    return PeerRound(
        where.comm,
        replayer,
        attr,
        record_ops=where.record_ops,
        collective=collective,
        setups=where.setups,
        job=where.job_comm,
        layout=where.layout,
    )
