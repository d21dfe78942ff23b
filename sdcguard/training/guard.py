"""``SDCGuard``: the training-side detector. It watches the step the framework runs and vetoes a corrupted one.

Every entry point is the same four calls around the framework's own forward and backward: ``begin_step``,
``before_forward`` (each micro-batch), ``observe_loss`` (the loss the backward starts from) and ``end_step`` (before
the optimizer). ``guard.step`` makes them for a plain loop; the Lightning and Hugging Face callbacks make them from
the framework's hooks. What happens on every data-parallel rank:

1. The framework runs its forward and backward, its gradient reduction and its overlap (DDP, FSDP2/HSDP); the guard
   adds hooks only (:mod:`.hooks`). On the sampled micro-batch of a sampled step (one step in ``replay_every``) they
   fingerprint its local gradients on the device as the framework hands them over; the micro-batch, random states,
   autocast state and seed are captured (:mod:`.replay`). On one step in ``checksum_every`` every matmul of the
   forward and backward is also checked against its checksum as it runs (:mod:`.checksums`).
2. ``end_step``: each step check (:mod:`.step_check`) adds its slice to the step's one all-gather and concludes from
   every rank's slice: the matmul checksums (a failure is the computing rank's own, recomputed on its device first),
   each rank's own shards against what the last optimizer step wrote and non-finite values (:mod:`.local`), the
   reduced gradients compared across replicas (:mod:`.replica`), the sampled round (each rank replays another
   rank's micro-batch, :mod:`.rounds.peer`, or sends it to a dedicated shadow, :mod:`.rounds.shadows`; a
   disagreement is settled by the rule of evidence, :mod:`.verdicts`), and slow ranks (:mod:`.timing`, the previous
   step's phase times: a ``slow`` incident never vetoes).
3. The veto, by one rule (:func:`~.step_check.decide`): with ``on_detect="skip"`` no rank commits a step a check
   vetoed, and its gradients are dropped (``.grad`` is set to None, so an optimizer step changes nothing). Every rank
   decides alike with no collective of its own, because every input of the decision came out of the gather. A sticky
   verdict escalates (:mod:`.verdicts.outcomes`); ``after_optimizer_step`` compares the weights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from ..errors import BadInput
from ..logs import RankLogger, get_logger
from ..records import Incident
from .checksums.bound import DEFAULT_ROWS
from .checksums.precision import DEFAULT_SPLITS
from .comm import Comm
from .config import Escalate, GuardConfig, OnDetect, StepReport
from .hooks.choice import choose_taps
from .hooks.ddp import is_ddp, wrap_ddp
from .hooks.fsdp import is_fsdp
from .hooks.wrappers import has_compiled_regions
from .loop import micro_batches_of, run_micro_batches
from .mesh import Layout
from .notices import construction_notices
from .placement import Placement, place
from .recovery.recover import Restored
from .recovery.state import Stateful
from .rejoin import make_rejoin
from .replay.capture import Batch, RngHook, capture_rng, make_capture
from .replay.recompute import LossFn
from .replay.stage import StageObserver, stage_output
from .replica import ReplicaPhases
from .response import Responder
from .rounds.roles import Role
from .rounds.shadows import ShadowServer
from .step_check import Cadence, StepCheck, StepState, decide, gather_step
from .timing import RankSlowness, SlowWatch
from .verdicts.attribution import Attributor
from .verdicts.calibration import CalibrationReport, calibrate, setup_warnings
from .verdicts.local import explained
from .verdicts.outcomes import Outcomes
from .wiring import Instruments, Parts, Where, make_checks

__all__ = ["SDCGuard"]


class SDCGuard:
    """Exact replay and cross-replica checks around each training step (see the module docstring).

    Constructing one is a collective over the job (every rank calls it; with dedicated shadows, shadows too).

    Args:
        model: the model as the loop trains it: a plain module, a DDP-wrapped one, or an FSDP2 (``fully_shard``)
            model. A plain module of a distributed job is wrapped in DDP by :meth:`step`.
        loss_fn: ``loss_fn(model, batch) -> scalar loss``; the guard runs it for the step (:meth:`step`) and for
            every replay, with the same batch.
        group: the data-parallel process group (default: the world; with a device mesh, this rank's data-parallel
            group in it, or None).
        mesh: the job's ``DeviceMesh`` with named dimensions (``dp``, ``dp_replicate``, ``dp_shard``, ``tp``,
            ``cp``: :mod:`.mesh`); by default read from the model's ``DTensor`` parameters. With a mesh the guard
            compares ranks holding the same shard, replays a micro-batch by a whole tensor-parallel group, and
            decides every step for the whole job.
        replay_every: replay one step in N on another device (0: never); None: ``$SDCGUARD_REPLAY_EVERY``, else 50.
        shadows: ``"peer"`` (data-parallel ranks replay each other's micro-batch) or the global ranks of dedicated
            shadows (see :func:`sdcguard.plan_roles`).
        weight_check_every: compare the weights across replicas every N steps in :meth:`after_optimizer_step`
            (0: never).
        store: path of the fleet store incidents and checkpoints are recorded in (by the group's first rank).
        on_detect: ``"record"``, ``"skip"`` (no rank commits a corrupted step), ``"raise"``
            (:class:`~sdcguard.errors.CorruptionDetected` on every rank) or ``"exit"`` (the exit-code contract).
        escalate: what a sticky or repeated unresolved verdict does under ``on_detect="skip"``: ``"raise"``,
            ``"exit"`` or ``"off"`` (:class:`~.config.GuardConfig` says more).
        rng_hook: saves and restores random states the guard does not know (a data loader's own generator).
        slow: when a rank is named slow (:class:`~.timing.SlowWatch`); None turns timing off.
        checksum_every: check every matmul of one step in N against its checksum (0: never); None:
            ``$SDCGUARD_CHECKSUM_EVERY``, else 4.
        checksum_rows: rows of a matmul's result summed per checksum.
        checksum_splits: the split-K partial sums the bound allows for in bf16/fp16 (:mod:`.checksums.precision`).
        train_context: the context the training step's forward and backward run in (torchtitan's
            ``train_context``; ``torch.distributed.tensor.parallel.loss_parallel`` for a parallel loss): every
            replay runs in it too, and so does :meth:`step`.
        optimizer: the optimizer (``escalate="recover"``: its state is in every snapshot; a dedicated shadow passes
            one over its own module, so it can be promoted).
        state: more objects with ``state_dict``/``load_state_dict`` a recovery restores (a scheduler, a data
            loader's position, random states), in the same order on every rank.
        min_replicas: under ``escalate="recover"`` without a spare, the fewest replicas the job goes on with.
        snapshot_dir: a node-local shared-memory folder (``/dev/shm/<job>``) the verified snapshots live in, so
            they survive a restart (:meth:`restore`); None: process memory.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        *,
        group: Any = None,
        mesh: Any = None,
        replay_every: int | None = None,
        shadows: Literal["peer"] | Sequence[int] = "peer",
        weight_check_every: int = 100,
        store: str | os.PathLike[str] | None = None,
        on_detect: OnDetect = "skip",
        escalate: Escalate = "raise",
        rng_hook: RngHook | None = None,
        slow: SlowWatch | None = SlowWatch(),
        checksum_every: int | None = None,
        checksum_rows: int = DEFAULT_ROWS,
        checksum_splits: int = DEFAULT_SPLITS,
        train_context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
        optimizer: Stateful | None = None,
        state: Sequence[Stateful] = (),
        min_replicas: int | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = GuardConfig.of(
            replay_every=replay_every,
            shadows="peer" if shadows == "peer" else tuple(shadows),
            weight_check_every=weight_check_every,
            on_detect=on_detect,
            escalate=escalate,
            store=None if store is None else os.fspath(store),
            checksum_every=checksum_every,
            checksum_rows=checksum_rows,
            checksum_splits=checksum_splits,
            min_replicas=min_replicas,
        )
        self.loss_fn = loss_fn
        wiring = choose_taps(model, dedicated_shadows=self.config.shadows != "peer")
        self.model, self.module, self.taps, self._ddp = model, wiring.core, wiring.taps, wiring.ddp
        self.params = list(self.taps.params)
        self.device = self.params[0].device
        self._step: int | None = None
        placed = self._place(group, mesh)
        view = placed.view
        self.identities: dict[int, tuple[str | None, str]] = view.identities
        self.setups: dict[int, tuple[str, ...]] = view.setups
        """Global rank -> what its device runs (:func:`~.identity.setup_key`)."""
        self.job = view.job
        """This job's id: the launcher's when it gave a real one, else one the first rank made (shared by all)."""
        self._attr = Attributor(self.taps.unit_names, self.identities, job=self.job, job_size=len(view.ranks))
        speaks = self.job_comm.index == 0
        self._outcomes = Outcomes(self._attr, list(self.job_comm.members), self.device, speaks=speaks)
        self._responder = Responder(
            on_detect, self.config.store, rank=self.rank, writer=speaks, escalate=escalate, job=self.job
        )
        self._instruments(loss_fn, rng_hook, slow, train_context)
        compiled = has_compiled_regions(self.model)
        self._parts = Parts(
            taps=self.taps,
            module=self.module,
            placement=placed,
            replayer=self._replayer,
            responder=self._responder,
            clock=self._clock,
            config=self.config,
            log=self.log,
            record_ops=not (self.taps.collective_replay or self.layout.meshed or compiled),
        )
        self._checks = self._make_checks(slow)
        checksum_every = 0 if compiled else self.config.checksum_every
        """Checksums off for a model with compiled regions (:mod:`.hooks.wrappers`)."""
        self._cadence = Cadence(replay_every=self.config.replay_every, checksum_every=checksum_every)
        self._closed = False
        meshed = self.layout.meshed  # model-parallel or pipeline dimensions
        self._rejoin = make_rejoin(self, self.config, optimizer, state, snapshot_dir=snapshot_dir, meshed=meshed)
        self.data_rank, self._batch = self.dp_rank, None  # whose batches it feeds: a recovery renumbers them
        self._say_notices(compiled)

    # ------------------------------------------------------------------------------------------------ setup

    def _place(self, group: Any, mesh: Any) -> Placement:
        """Where this rank stands (:mod:`.placement`): its role and groups, every rank's identity, the layout."""
        reduced = is_fsdp(self.module) or self._ddp is not None
        p = place(
            self.config.shadows, group, mesh, taps=self.taps, module=self.module, device=self.device, reduced=reduced
        )
        self._stand(p.role, p.shadow_ranks, p.job_comm, p.comm, p.layout)
        self.rank = self.job_comm.rank
        self.log = RankLogger(get_logger("training"), self.rank, lambda: self._step)
        return p

    def _instruments(self, loss_fn: LossFn, rng_hook: RngHook | None, slow: SlowWatch | None, context: Any) -> None:
        """What watches the step, times it and replays it (:class:`~.wiring.Instruments`)."""
        timed = slow is not None and not self.shadow_ranks and self.role == "worker" and self.layout.width > 1
        unit = self.layout.unit_of(self.rank)
        made = Instruments.make(self.taps, loss_fn, unit=unit, rng_hook=rng_hook, timed=timed, context=context)
        self._made, self._clock, self._replayer = made, made.clock, made.replayer
        self._observer = made.observer(self.dp_rank, stage=bool(self.layout.stages) or loss_fn is stage_output)
        self._train_context, self._rng_hook = context, rng_hook

    def _say_notices(self, compiled: bool) -> None:
        """What this rank says once as it starts (:mod:`.notices`)."""
        for notice in construction_notices(
            speaks=self.job_comm.index == 0 and self.role == "worker",
            worker=self.role == "worker",
            replicas=self._replica.active,
            job_size=self.job_comm.size,
            cuda_problems=setup_warnings(self.device),
            setups=self.setups,
            compiled=compiled and bool(self.config.checksum_every),
        ):
            self.log.warning("%s", notice)

    def _stand(self, role: Role, shadow_ranks: Sequence[int], job_comm: Comm, comm: Comm, layout: Layout) -> None:
        """Take up a place in the job: at construction, and in the group a recovery re-formed (:meth:`regroup`)."""
        self.role, self.shadow_ranks, self.layout = role, tuple(shadow_ranks), layout
        self.job_comm, self.comm, self.group, self.members = job_comm, comm, comm.group, comm.members
        self.dp_size, self.dp_rank = comm.size, comm.index

    def _make_checks(self, slow: SlowWatch | None) -> list[StepCheck]:
        """The step's checks for where this rank stands now (:mod:`.wiring`)."""
        where = Where(job_comm=self.job_comm, comm=self.comm, layout=self.layout, shadow_ranks=self.shadow_ranks)
        c = make_checks(where, self._parts, attr=self._attr, outcomes=self._outcomes, ddp=self._ddp, slow=slow)
        self._replica: ReplicaPhases = c.replica
        self._weights, self._round = c.weights, c.round
        self._checksums, self._memory, self._slow = c.checksums, c.memory, c.slow
        return c.all

    # ------------------------------------------------------------------------------------------- the step

    @property
    def observing(self) -> bool:
        """Between ``begin_step`` and ``end_step``."""
        return self._observer.active

    @property
    def replaying(self) -> bool:
        """True while the guard replays (a framework hook that sees a forward then is seeing the guard's own)."""
        return self._replayer.replaying

    def begin_step(self, step: int, *, micro_batches: int = 1) -> None:
        """Start observing optimizer step ``step`` (``micro_batches``: how many forwards it accumulates)."""
        if self.role != "worker":
            raise RuntimeError("a dedicated shadow rank runs guard.serve(), not the training step")
        if micro_batches < 1:
            raise BadInput(f"micro_batches must be >= 1, got {micro_batches}")
        self._step = step
        self._responder.record(self._rejoin.begin_step(step, self.last_verified_step))
        samples = self._cadence.samples
        record = self._cadence.begin(step, replay_on=self._outcomes.replay_on) and self._round.round.records(samples)
        self._observer.begin(step, record=record, chosen=samples % micro_batches)
        self._clock.begin_step()
        if self._cadence.checksummed(step):
            self._checksums.mode.begin()

    def before_forward(self, batch: Batch) -> None:
        """Call right before each micro-batch's forward, with that micro-batch."""
        self._observer.before_forward(batch)
        self._batch = batch

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Call before the backward with the loss as ``loss_fn(model, batch)`` returns it (what a replay recomputes);
        the backward may start from any function of it (divided for accumulation, scaled by a ``GradScaler``): the
        gradient that flows into it is what a replay's backward starts from."""
        self._observer.observe_loss(loss)

    def end_step(self, *, loss: torch.Tensor | None = None) -> StepReport:
        """After the backward, before the optimizer: the checks and the veto (collective over the group)."""
        step = self._observer.step
        if step is None:
            raise RuntimeError("end_step() without begin_step()")
        observed, losses = self._observer.finish(), self._observer.nonfinite_losses
        sampled, sample = self._cadence.sampled, self._cadence.samples
        state = StepState(step=step, sample=sample, sampled=sampled, observed=observed, nonfinite=losses)
        self._clock.end_compute(state.sample if state.sampled else None)
        parts = [(c.name, c.columns(state)) for c in self._checks]
        with self._clock.waiting():
            table = gather_step(self.job_comm, parts, self.device)
        results = [c.conclude(state, table.rows(c.name)) for c in self._checks]
        decision = decide(results, record_only=self.config.on_detect == "record")
        found = [self._outcomes.rollback(i, vetoed=not decision.commit and i.step == step) for i in decision.incidents]
        if not decision.commit:
            for p in self.params:
                p.grad = None  # the optimizer skips parameters without gradients: the step changes nothing
        self._cadence.end(step, sampled=state.sampled)
        self._clock.end_step()
        self._rejoin.end_step(step, committed_sample=decision.commit and state.sampled)
        escalating = self._responder.handle(found, escalate=self._outcomes.escalating(found))
        resume = self._rejoin.recover(step, escalating, self._outcomes.verification)
        if resume is not None:
            self._memory.forget()  # the weights were restored: the next optimizer step makes the new reference
        return StepReport(
            step=step,
            loss=loss if loss is not None else torch.full((), float("nan")),
            commit=decision.commit,
            incidents=tuple(found),
            replayed=state.sampled,
            checks=decision.checks,
            matmuls_run=self._checksums.run,
            matmuls_checked=self._checksums.checked,
            matmuls_unverifiable=self._checksums.unverifiable,
            unverifiable=self._checksums.named,
            resume_from=resume,
        )

    def step(self, step: int, batch: Batch = None, *, micro_batches: Sequence[Batch] | None = None) -> StepReport:
        """Forward, backward, checks and veto for one optimizer step of a plain loop.

        ``batch`` is this rank's micro-batch; with gradient accumulation pass ``micro_batches=[...]`` instead (each
        loss is divided by their number, as an accumulating loop would; DDP synchronises on the last one). On commit
        the gradients are in ``.grad``; on a vetoed step ``.grad`` is None. ``loss_fn`` receives the model as given
        (the guard wraps a plain module of a distributed job in DDP); replays receive the module without wrapper.
        """
        mbs = micro_batches_of(batch, micro_batches)
        if self.role == "worker" and not self.comm.alone and self._ddp is None and not is_fsdp(self.module):
            self.model = self._ddp = wrap_ddp(self.model, self.group, self.taps)  # its reduction, overlapped
        return run_micro_batches(self, step, mbs, ddp=self._ddp, context=self._train_context)

    def watch_stage(self, watched: bool = True) -> None:
        """:func:`~sdcguard.adapters.pipelining.watch_stage` (and its ``remove``) says whether the schedule feeds this
        guard a pipeline stage's micro-batches; a stage's guard nothing feeds refuses its first step in one line."""
        observer = self._observer
        if not isinstance(observer, StageObserver):  # a group per stage, with a loss_fn of its own
            observer = self._observer = self._made.stage_observer(self.dp_rank)
        observer.watched = watched

    def abandon_step(self) -> None:
        """After a failure between ``begin_step`` and ``end_step``: stop observing the step (its hooks disarmed, the
        matmul checksums off), so the next ``begin_step`` starts clean. Makes no collective."""
        self._observer.finish()
        self._checksums.mode.end()

    def after_optimizer_step(self) -> list[Incident]:
        """Every step, after ``optimizer.step()`` (and anything else that writes the weights): fingerprint this rank's
        shards for the next step's memory check; compare the weights across replicas when the schedule says so."""
        self._memory.settle()
        every, last = self.config.weight_check_every, self._cadence.last_step
        if self.role != "worker" or not every or last is None or last % every or not self._weights.active:
            return []
        checked = explained(self._weights.check(last), self._memory.named)  # a rank's memory explains it
        found = [self._outcomes.rollback(i, vetoed=False) for i in checked]
        self._outcomes.verification.weights_compared(last, agreed=not found)
        self._responder.handle(found)
        return found

    # ----------------------------------------------------------------------------------- other entry points

    @property
    def incidents(self) -> list[Incident]:
        """Every incident so far (identical on every rank of the group)."""
        return self._responder.incidents

    @property
    def slowness(self) -> dict[int, RankSlowness]:
        """Each rank's recent slowdowns against the devices that computed the same micro-batches, and their bound
        (global rank -> :class:`~.timing.RankSlowness`; empty when not timed: ``slow=None``, dedicated shadows, one
        rank). Identical on every rank."""
        return self._slow.ranks() if self._slow is not None else {}

    @property
    def last_verified_step(self) -> int | None:
        """The last step every rank's checks vouch for: every rank's latest clean sample is at or after it, and no
        incident since then may have reached the weights (see :mod:`.verdicts.verification`). None before every
        rank was sampled cleanly, or when replay is off."""
        return self._outcomes.verification.last_verified_step

    def record_checkpoint(self, checkpoint_id: str, step: int, digest: str = "") -> bool:
        """Remember a checkpoint of the state after ``step`` (``sdcguard.checkpoint.save`` calls it on every rank);
        whether that state is verified. Later incidents name the newest verified checkpoint to restart from; with a
        fleet store, the group's first rank records it there."""
        verified = self._outcomes.verification.note_checkpoint(checkpoint_id, step).verified
        self._responder.record_checkpoint(checkpoint_id, step, verified, digest)
        return verified

    @property
    def nondeterministic(self) -> bool:
        """True once replays on this setup proved not bit-identical (replay checks are then off)."""
        return not self._outcomes.replay_on

    def calibrate(self, batch: Batch) -> CalibrationReport:
        """Compute one clean micro-batch (the first rank's ``batch``) twice on every rank: does the setup replay bit
        for bit, and does every device agree?

        Touches neither ``.grad`` nor the random streams. Every worker calls it (collective). Software is blamed
        only when two or more devices disagree with themselves: replay checks then turn off and the report names the
        likely causes. A device that disagrees with the majority is named in an incident (kind ``calibration``) and
        handled like any other; a disagreement nobody can settle is ``unresolved``."""
        if self.role != "worker":
            raise RuntimeError("calibrate() runs on the data-parallel workers")
        cap = make_capture(step=-1, rank=self.dp_rank, micro_batch=0, batch=batch, rng=capture_rng(self._rng_hook))
        report, j = calibrate(
            self.comm, self._replayer, cap, self.device, record_ops=self._parts.record_ops, setups=self.setups
        )  # every slice at once: a tensor-parallel group computes its micro-batch together
        runs = [(report, j, self.members[0])]
        if self.layout.meshed:  # every rank concludes from every slice's calibration, alike
            runs = self.job_comm.gather_objects(runs[0])
        report, found = self._outcomes.calibrated_runs(runs, self.dp_size)
        escalating = self._responder.handle(found, escalate=self._outcomes.escalating(found))
        self._rejoin.recover(-1, escalating, self._outcomes.verification)  # "recover" before any snapshot: all exit
        return report

    def serve(self) -> int:
        """On a dedicated shadow rank: replay the samples workers send until every worker calls ``close()``, or until
        a recovery promotes this rank (``escalate="recover"``: then :attr:`role` is ``"worker"``, and the loop goes
        on at :attr:`resume_from` with the batches of :attr:`data_rank`). Returns the samples replayed."""
        if self.role != "shadow":
            raise RuntimeError("guard.serve() runs on dedicated shadow ranks only")
        server = ShadowServer(self.params, self._replayer, num_workers=self.dp_size)
        return self._rejoin.serve(server)

    # ------------------------------------------------------------------ recovery: the seam of :mod:`.rejoin`

    @property
    def resume_from(self) -> int | None:
        """The step the last recovery went on from (a promoted spare starts there); None before any."""
        return self._rejoin.resume_from

    def restore(self, fallback: Callable[[], int] | None = None) -> Restored:
        """A restarted job's workers, before the first step (``snapshot_dir=``): the newest verified snapshot in host
        memory a vote of the replicas confirms, else ``fallback()`` (it loads the last verified disk checkpoint and
        returns the step to go on at); which, in the result and a log line (:meth:`~.rejoin.Rejoin.restore`)."""
        if self.role != "worker":
            raise BadInput('guard.restore() runs on the workers of a guard with escalate="recover"')
        return self._rejoin.restore(self.comm, fallback)

    @property
    def snapshot_step(self) -> int | None:
        """The step the verified snapshot starts (what a recovery would roll back to now); None: none kept."""
        return self._rejoin.snapshot_step

    @property
    def last_batch(self) -> Batch:
        """This rank's last micro-batch (None before the first)."""
        return self._batch

    def tell_shadows(self, plan: Any, incidents: Sequence[Incident]) -> None:
        """Send a recovery's plan to the dedicated shadows (:class:`~.rejoin.Rejoin` calls it on every worker)."""
        self._round.round.reform(plan, incidents)

    def regroup(self, comm: Comm, model: nn.Module, *, shadows: Sequence[int], leavers: Sequence[int]) -> None:
        """After a recovery (:class:`~.rejoin.Rejoin`): take up the re-formed group ``comm`` as a worker numbered by
        its place (the order the group sums in), training ``model``, with the checks made again for its members
        (what was learnt about determinism and earlier suspects is kept; ``leavers`` are gone)."""
        self._stand("worker", shadows, comm, comm, Layout(ranks=tuple(comm.members), slices=(tuple(comm.members),)))
        self.data_rank = comm.index
        self.model, self._ddp = model, model if is_ddp(model) else None
        self._attr = Attributor(self.taps.unit_names, self.identities, job=self.job, job_size=comm.size)
        speaks = comm.index == 0
        self._outcomes = self._outcomes.regrouped(self._attr, list(comm.members), leavers, speaks=speaks)
        self._responder.writer, self._responder.before_acting = speaks, None
        self._cadence.join(int(comm.gather_ints([self._cadence.samples]).max()))
        self._observer = self._made.observer(self.dp_rank)
        self._checks = self._make_checks(None)

    def close(self) -> list[Incident]:
        """End of training: collect outstanding shadow verdicts, release the shadows, remove the hooks."""
        if self._closed:
            return []
        self._closed = True
        found: list[Incident] = []
        if self.role == "worker":
            found = [self._outcomes.rollback(i, vetoed=False) for i in self._round.close()]
            self._responder.record(self._responder.handle(found, escalate=self._outcomes.escalating(found)))
        self._checksums.mode.end()
        self.taps.close()
        self._rejoin.close()
        return found

    def state_dict(self) -> dict[str, Any]:
        """Counters a resumed run needs (the sample counter drives pairings and micro-batch choice)."""
        slow = self._slow.state_dict() if self._slow is not None else {}
        counters = self._cadence.state_dict()
        return {"version": 2, **counters, "slow": slow, **self._outcomes.state_dict(), "incidents": len(self.incidents)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") not in (1, 2):
            raise BadInput(f"unknown SDCGuard state version {state.get('version')!r}")
        self._cadence.load_state_dict(state)
        self._outcomes.load_state_dict(state)
        if self._slow is not None:
            self._slow.load_state_dict(state.get("slow", {}))
