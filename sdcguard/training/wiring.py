"""The step's checks of one guard, made from where it stands in the job: at construction, and again in the group a
recovery re-formed (:meth:`~.guard.SDCGuard.regroup`). Split from :mod:`.guard` by job: what is made here is
made the same way both times.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..errors import BadInput
from .checksums.mode import ChecksumMode
from .checksums.round import ChecksumCheck
from .comm import Comm
from .config import GuardConfig
from .hooks.ddp import ParamTaps
from .hooks.taps import Taps
from .local.finite import NonFiniteCheck
from .local.memory import MemoryCheck
from .local.reduction import ReductionCheck
from .mesh import Layout
from .placement import Placement
from .replay.capture import RngHook
from .replay.collectives import CollectiveTracer, unit_tracer
from .replay.observe import StepObserver
from .replay.recompute import LossFn, Replayer
from .replay.stage import StageObserver
from .replica import GradientReplicaCheck, ReplicaPhases, WeightCheck
from .response import Responder
from .rounds.peer import PeerRound
from .rounds.round import Round, RoundCheck
from .rounds.shadows import DedicatedRound
from .step_check import StepCheck
from .timing import IdleClock, PhaseClock, SlowJudge, SlowWatch, TimingCheck
from .verdicts.attribution import Attributor
from .verdicts.outcomes import Outcomes

__all__ = ["Checks", "Instruments", "Parts", "Where", "make_checks"]


@dataclass(frozen=True, kw_only=True)
class Instruments:
    """What times a guard's step (the clock, when slow ranks are watched), replays it (the replayer) and watches it
    (an observer, for a whole step or a pipeline stage's micro-batches), each tracing the collectives of the unit the
    rank computes with (:mod:`.replay.collectives`; ``tracer`` is None outside a unit)."""

    taps: Taps
    device: torch.device
    rng_hook: RngHook | None
    tracer: CollectiveTracer | None
    clock: PhaseClock
    replayer: Replayer

    @classmethod
    def make(
        cls,
        taps: Taps,
        loss_fn: LossFn,
        *,
        unit: tuple[int, ...],
        rng_hook: RngHook | None,
        timed: bool,
        context: Callable[[], contextlib.AbstractContextManager[object]],
    ) -> Instruments:
        device, tracer = taps.params[0].device, unit_tracer(unit)
        clock = PhaseClock(device) if timed else IdleClock()
        replayer = Replayer(taps, loss_fn, rng_hook=rng_hook, timed=clock.replay, context=context, tracer=tracer)
        return cls(taps=taps, device=device, rng_hook=rng_hook, tracer=tracer, clock=clock, replayer=replayer)

    def observer(self, dp_rank: int, *, stage: bool = False) -> StepObserver:
        """An observer for data-parallel rank ``dp_rank`` (``stage``: of a pipeline stage's micro-batches)."""
        if stage:
            return self.stage_observer(dp_rank)
        return StepObserver(self.taps, rank=dp_rank, device=self.device, rng_hook=self.rng_hook, tracer=self.tracer)

    def stage_observer(self, dp_rank: int) -> StageObserver:
        return StageObserver(self.taps, rank=dp_rank, device=self.device, rng_hook=self.rng_hook, tracer=self.tracer)


@dataclass(frozen=True, kw_only=True)
class Where:
    """Where a guard stands in the job: what a recovery changes."""

    job_comm: Comm
    """The group of the step's gather."""
    comm: Comm
    """This rank's data-parallel group."""
    layout: Layout
    shadow_ranks: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Parts:
    """What a guard's checks are made of that a recovery keeps: its taps and module, where it was placed (the job's
    view, the parameters' replica classes, the frozen ones), its replayer, clock and responder, and its settings."""

    taps: Taps
    module: nn.Module
    placement: Placement
    replayer: Replayer
    responder: Responder
    clock: PhaseClock
    config: GuardConfig
    record_ops: bool
    """Settling reruns may run under the op recorder (:meth:`~.guard.SDCGuard` decides)."""
    log: logging.LoggerAdapter[logging.Logger]

    @property
    def params(self) -> list[nn.Parameter]:
        return list(self.taps.params)

    @property
    def device(self) -> torch.device:
        return self.params[0].device


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
    parts: Parts,
    *,
    attr: Attributor,
    outcomes: Outcomes,
    slow: SlowWatch | None,
    ddp: DistributedDataParallel | None = None,
) -> Checks:
    """The checksums (their mode is popped first: no replay runs under it), each rank's own shards against their
    fingerprint from after the optimizer step, non-finite losses and gradients, the gradients' path into ``ddp``'s
    reduction (the model's DDP wrapper, watched from now on), the reduced gradients across replicas, the sampled
    round, and the timing of slow ranks when timed."""
    taps, view, device = parts.taps, parts.placement.view, parts.device
    job_ranks = list(where.job_comm.members)
    rank_keys = view.keys(job_ranks)
    if len({len(k) for k in rank_keys}) > 1:
        raise BadInput("the ranks' parameters are sharded differently (their DTensor placements differ)")
    ids = [(g, *view.identities.get(g, (None, ""))) for g in job_ranks]
    replica = ReplicaPhases(
        where.job_comm, rank_keys, taps.param_names, ids, view.job, parts.placement.classes[: len(parts.params)]
    )
    names = [*taps.param_names, *(f"{name} (frozen)" for name, _ in parts.placement.frozen)]
    frozen_weights = [w.detach() for _, w in parts.placement.frozen]
    weights = WeightCheck(
        ReplicaPhases(where.job_comm, rank_keys, names, ids, view.job, parts.placement.classes),
        taps.weights,
        frozen_weights,
    )
    memory = MemoryCheck(
        lambda: [*taps.weights(), *frozen_weights], names, ids, view.job, device, index=where.job_comm.index
    )
    finite = NonFiniteCheck(taps.reduced, ids, view.job, device)
    speaks = where.job_comm.index == 0
    watch = taps.reduction if isinstance(taps, ParamTaps) else None
    if watch is not None and ddp is not None and not watch.watch(ddp) and speaks:
        parts.log.warning("the gradients' path into DDP's all-reduce is not checked: %s", watch.refused)
    reduction = ReductionCheck(watch, taps.param_names, ids, view.job, device)
    rnd = RoundCheck(_make_round(where, parts, attr), outcomes, device, parts.log, speaks=speaks)
    escalate: Callable[..., None] | None = rnd.round.escalate if where.shadow_ranks else None
    if escalate is not None:  # an escalation reaches the dedicated shadows too (they raise or exit alike)
        parts.responder.before_acting = escalate
    checksums = ChecksumCheck(
        ChecksumMode(parts.module, rows=parts.config.checksum_rows, splits=parts.config.checksum_splits),
        where.job_comm,
        attr,
        device,
    )
    judge = (
        SlowJudge(slow, job_ranks, view.identities, job=view.job, job_size=len(view.ranks), slices=where.layout.slices)
        if slow is not None and not isinstance(parts.clock, IdleClock)
        else None
    )
    checks: list[StepCheck] = [
        checksums,
        memory,
        finite,
        reduction,
        GradientReplicaCheck(replica, taps.reduced, device),
        rnd,
    ]
    if judge is not None:
        checks.append(TimingCheck(parts.clock, judge, device))
    return Checks(
        replica=replica, weights=weights, round=rnd, checksums=checksums, memory=memory, slow=judge, all=checks
    )


def _make_round(where: Where, parts: Parts, attr: Attributor) -> Round:
    if where.shadow_ranks:
        return DedicatedRound(where.comm, where.shadow_ranks, parts.params, parts.replayer, attr)
    collective = parts.taps.collective_replay or where.layout.meshed
    return PeerRound(
        where.comm,
        parts.replayer,
        attr,
        record_ops=parts.record_ops,
        collective=collective,
        setups=parts.placement.view.setups,
        job=where.job_comm,
        layout=where.layout,
    )
