"""``SDCGuard``: the training-side detector. It watches the step the framework runs and vetoes a corrupted one.

Every entry point is the same four calls around the framework's own forward and backward: ``begin_step``,
``before_forward`` (each micro-batch), ``observe_loss`` (the loss the backward starts from) and ``end_step`` (before
the optimizer). ``guard.step`` makes them for a plain loop; the Lightning and Hugging Face callbacks make them from
the framework's hooks. What happens on every data-parallel rank:

1. The framework runs its forward and backward, its gradient reduction and its overlap (DDP, FSDP2/HSDP); the guard adds
   hooks only (:mod:`.hooks.ddp`: a tensor hook per parameter; :mod:`.hooks.fsdp`: a custom reduce-scatter). On the
   sampled micro-batch of a sampled step (one step in ``replay_every``) they fingerprint its local gradients on the
   device as the framework hands them over; the micro-batch, random states, autocast state and seed are captured.
2. ``end_step``: the gradients the optimizer is about to read are fingerprinted in place and folded into one value; on a
   sampled step the :class:`~.rounds.round.Round` runs: each rank replays another rank's micro-batch
   (:mod:`.rounds.peer`) or sends it to a dedicated shadow (:mod:`.rounds.shadows`). Everything the veto needs rides in
   one all-gather.
3. Replicas holding the same data must agree bit for bit (:mod:`.replica`); an original and its replay must agree
   too, and a disagreement is settled by the rule of evidence (:mod:`.verdicts.attribution`): a device that others
   contradict while it reproduces itself is hardware, devices that do not reproduce themselves are software
   (:mod:`.verdicts.calibration`), and evidence that cannot pick the device is unresolved, vetoed all the same. A
   sticky verdict escalates (:mod:`.verdicts.outcomes`).
4. The veto: with ``on_detect="skip"`` no rank commits a corrupted step, and its gradients are dropped (``.grad`` is
   set to None, so an optimizer step changes nothing). Every rank decides alike with no collective of its own,
   because every input of the decision came out of the gathers above. ``after_optimizer_step`` compares the weights.
5. Slowness (:mod:`.timing`): each rank's phase times ride the next step's gather; a rank consistently slower than
   the devices that computed the same micro-batches is named in a ``slow`` incident, after the veto and never
   deciding it.

On one step in ``checksum_every`` every matmul of the forward and backward is also checked against its checksum as
it runs (:mod:`.checksums`); a failure is this rank's own, recomputed on its device before it is reported, and its
count rides in the same all-gather (:mod:`.checksums.round`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from ..devices import hostname
from ..errors import BadInput
from ..records import Incident
from .checksums.bound import DEFAULT_ROWS
from .checksums.mode import ChecksumMode
from .checksums.precision import DEFAULT_SPLITS
from .checksums.round import WIDTH as CHECKSUM_WIDTH
from .checksums.round import checksum_incidents
from .checksums.round import columns as checksum_columns
from .comm import Comm
from .config import DEFAULT_CHECKSUM_EVERY, Check, Escalate, GuardConfig, OnDetect, StepReport
from .digest import Digest
from .hooks.ddp import ParamTaps, is_ddp, unwrap, wrap_ddp
from .hooks.fsdp import FSDPTaps, is_fsdp
from .identity import launcher_job_id, local_device_id, new_job_id, setup_key
from .replay.capture import Batch, Capture, RngHook, capture_rng, make_capture
from .replay.observe import StepObserver
from .replay.recompute import LossFn, check_loss, replay
from .replica import ReplicaPhases
from .response import Responder, exit_status
from .rounds.peer import PeerRound
from .rounds.roles import worker_group
from .rounds.round import Round
from .rounds.shadows import DedicatedRound, ShadowServer
from .timing import COLUMNS as TIMING_COLUMNS
from .timing import PhaseClock, RankSlowness, SlowJudge, SlowWatch
from .verdicts.attribution import Attributor
from .verdicts.calibration import CalibrationReport, calibrate, setup_warnings
from .verdicts.outcomes import Outcomes

__all__ = ["SDCGuard"]


class SDCGuard:
    """Exact replay and cross-replica checks around each training step (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        *,
        group: Any = None,
        replay_every: int = 50,
        shadows: Literal["peer"] | Sequence[int] = "peer",
        weight_check_every: int = 100,
        store: str | os.PathLike[str] | None = None,
        on_detect: OnDetect = "skip",
        escalate: Escalate = "raise",
        rng_hook: RngHook | None = None,
        slow: SlowWatch | None = SlowWatch(),
        checksum_every: int = DEFAULT_CHECKSUM_EVERY,
        checksum_rows: int = DEFAULT_ROWS,
        checksum_splits: int = DEFAULT_SPLITS,
    ) -> None:
        self.config = GuardConfig(
            replay_every=replay_every,
            shadows="peer" if shadows == "peer" else tuple(shadows),
            weight_check_every=weight_check_every,
            on_detect=on_detect,
            escalate=escalate,
            store=None if store is None else os.fspath(store),
            checksum_every=checksum_every,
            checksum_rows=checksum_rows,
            checksum_splits=checksum_splits,
        )
        self.loss_fn = loss_fn
        self.rng_hook = rng_hook
        self._roles(group)
        self.model, self.module, self.taps = self._wire(model)
        self.params = list(self.taps.params)
        self.device = self.params[0].device
        world = Comm() if self.shadow_ranks else self.comm
        everyone = world.gather_objects(
            (
                local_device_id(self.device),
                hostname(),
                self._replica_key(),
                setup_key(self.device),
                launcher_job_id() or new_job_id(),
            )
        )
        self.identities: dict[int, tuple[str | None, str]] = {g: (e[0], e[1]) for g, e in zip(world.members, everyone)}
        self._keys = [e[2] for g, e in zip(world.members, everyone) if g in self.members]
        self.setups: dict[int, tuple[str, ...]] = {g: e[3] for g, e in zip(world.members, everyone)}
        """Global rank -> what its device runs (:func:`~.identity.setup_key`)."""
        self.job = str(everyone[0][4])
        """This job's id: the launcher's when it gave a real one, else one the first rank made (shared by all)."""
        self._attr = Attributor(self.taps.unit_names, self.identities, job=self.job, job_size=len(world.members))
        self._replica = ReplicaPhases(
            self.comm,
            self._keys,
            self.taps.param_names,
            [(g, *self.identities.get(g, (None, ""))) for g in self.members],
            self.job,
        )
        self._responder = Responder(
            on_detect, self.config.store, rank=self.rank, writer=self.dp_rank == 0, escalate=escalate, job=self.job
        )
        self._outcomes = Outcomes(self._attr, self.members, self.device, speaks=self.dp_rank == 0)
        self._determinism = self._outcomes.determinism
        self._verification = self._outcomes.verification
        self._observer = StepObserver(self.taps, rank=self.dp_rank, device=self.device, rng_hook=rng_hook)
        self._round: Round = (
            DedicatedRound(self.comm, self.shadow_ranks, self.params, self._replay, self._attr)
            if self.shadow_ranks
            else PeerRound(
                self.comm,
                lambda c, same: self._replay(c, same),
                self._attr,
                record_ops=not self.taps.collective_replay,
                collective=self.taps.collective_replay,
                setups=self.setups,
            )
        )
        if self.shadow_ranks:  # an escalation reaches the dedicated shadows too (they raise or exit alike)
            self._responder.before_acting = lambda action, found: self._round.escalate(
                action, found, lambda rank: exit_status(rank, found)
            )
        timed = slow is not None and not self.shadow_ranks and self.role == "worker" and self.dp_size > 1
        self._clock = PhaseClock(self.device) if timed else None
        """Step phase times (:mod:`.timing`); None: not timed (off, dedicated shadows, or a single rank)."""
        self._slow = (
            SlowJudge(slow, self.members, self.identities, job=self.job, job_size=len(world.members))
            if timed and slow is not None
            else None
        )
        self._checksums = ChecksumMode(self.module, rows=checksum_rows, splits=checksum_splits)
        """Checksum checks of the matmuls on one step in ``checksum_every`` (:mod:`.checksums`)."""
        self._steps = self._samples = 0
        self._last_step: int | None = None
        self._sampled = self._closed = False
        self._warned_unjudged = False
        self.replaying = False
        """True while the guard replays (a framework hook that sees a forward then is seeing the guard's own)."""
        if self.role == "worker" and (problems := setup_warnings(self.device)):
            warnings.warn(
                "sdcguard: replays on CUDA will not be bit-identical, so replay checks will turn "
                f"themselves off: {'; '.join(problems)}",
                RuntimeWarning,
                stacklevel=2,
            )
        if self.role == "worker" and self.dp_rank == 0 and len(set(self.setups.values())) > 1:
            kinds = sorted({", ".join(v) for v in self.setups.values()})
            warnings.warn(
                "sdcguard: the devices of this job run different setups (" + " | ".join(kinds) + "); "
                "replays between devices of different setups may differ without any fault, and such a "
                "disagreement is reported as the setup's, never blamed on a device",
                RuntimeWarning,
                stacklevel=2,
            )

    # ------------------------------------------------------------------------------------------------ setup

    def _roles(self, group: Any) -> None:
        self.role, self.shadow_ranks, self.comm = worker_group(self.config.shadows, group)
        self.group = self.comm.group
        self.rank, self.members, self.dp_size, self.dp_rank = (
            self.comm.rank,
            self.comm.members,
            self.comm.size,
            self.comm.index,
        )

    def _wire(self, model: nn.Module) -> tuple[nn.Module, nn.Module, ParamTaps | FSDPTaps]:
        if is_fsdp(model):
            if self.shadow_ranks:
                raise BadInput("dedicated shadows replay a whole model on one device: use peer mode with FSDP2")
            return model, model, FSDPTaps(model)
        module = unwrap(model)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise BadInput("the model has no parameter that requires a gradient")
        return model, module, ParamTaps(module, named)

    def _replica_key(self) -> object:
        return self.taps.replica_key() if isinstance(self.taps, FSDPTaps) else ()

    # ------------------------------------------------------------------------------------------- the step

    @property
    def observing(self) -> bool:
        """Between ``begin_step`` and ``end_step``."""
        return self._observer.active

    def begin_step(self, step: int, *, micro_batches: int = 1) -> None:
        """Start observing optimizer step ``step`` (``micro_batches``: how many forwards it accumulates)."""
        if self.role != "worker":
            raise RuntimeError("a dedicated shadow rank runs guard.serve(), not the training step")
        if micro_batches < 1:
            raise BadInput(f"micro_batches must be >= 1, got {micro_batches}")
        self._sampled = (
            self.config.replay_every > 0
            and step % self.config.replay_every == 0
            and self._determinism.state != "nondeterministic"
        )
        record = self._sampled and self._round.records(self._samples)
        self._observer.begin(step, record=record, chosen=self._samples % micro_batches)
        if self._clock is not None:
            self._clock.begin_step()
        if self.config.checksum_every and step % self.config.checksum_every == 0:
            self._checksums.begin()

    def before_forward(self, batch: Batch) -> None:
        """Call right before each micro-batch's forward, with that micro-batch."""
        self._observer.before_forward(batch)

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
        observed = self._observer.finish()
        checked = self._checksums.active
        failures = self._checksums.end()  # recomputes a failed matmul on this device before anyone is blamed
        sampled, sample = self._sampled, self._samples
        if self._clock is not None:
            self._clock.end_compute(sample if sampled else None)
        reduced = self.taps.reduced()
        own = self._replica.column(reduced, self.device)  # on the device, no sync
        extra = torch.tensor(
            self._round.columns(step, sample, sampled, observed) + checksum_columns(failures),
            dtype=torch.int64,
            device=self.device,
        )
        timing = self._timing_columns()
        with self._clock.waiting() if self._clock is not None else contextlib.nullcontext():
            table = self.comm.gather_ints(torch.cat([own, extra, timing])).tolist()
        if self._clock is not None:  # the timing columns are the last ones
            timing_rows, table = [row[-TIMING_COLUMNS:] for row in table], [row[:-TIMING_COLUMNS] for row in table]
        sums = [row[len(row) - CHECKSUM_WIDTH :] for row in table]  # then the checksums' columns
        table = [row[: len(row) - CHECKSUM_WIDTH] for row in table]
        found = self._replica.incidents("gradient_replica", step, reduced, [row[0] for row in table])
        replicas_differ = bool(found)  # whoever is wrong, a step whose replicas differ is not sound
        found += checksum_incidents(self.comm, self._attr, step, sums, failures)
        results = self._round.finish(step, sample, sampled, [row[1:] for row in table])
        if sampled:
            self._samples += 1
        if any(r.unjudged for r in results):
            self._warn_unjudged()
        for result in results:
            found += self._outcomes.settled(result)
        corrupt = any(r.corrupt and r.vetoable and r.step == step for r in results) or any(row[0] for row in sums)
        commit = not ((replicas_differ or corrupt) and self.config.on_detect != "record")
        found = [self._outcomes.rollback(i, vetoed=not commit and i.step == step) for i in found]
        if self._slow is not None:  # after the veto: slowness never decides a commit
            found += self._slow.observe(step, timing_rows)
        if not commit:
            for p in self.params:
                p.grad = None  # the optimizer skips parameters without gradients: the step changes nothing
        self._steps += 1
        self._last_step = step
        if self._clock is not None:
            self._clock.end_step()
        self._responder.handle(found, escalate=self._outcomes.escalating(found))
        checks: list[Check] = []
        if self._replica.active:
            checks.append("gradient_replica")
        if sampled:
            checks.append("replay")
        if checked:
            checks.append("checksum")
        mean = loss if loss is not None else torch.full((), float("nan"))
        return StepReport(
            step=step,
            loss=mean,
            commit=commit,
            incidents=tuple(found),
            replayed=sampled,
            checks=tuple(checks),
            matmuls_run=self._checksums.run if checked else 0,
            matmuls_checked=self._checksums.checked if checked else 0,
            matmuls_unverifiable=self._checksums.unverifiable if checked else 0,
            unverifiable=self._checksums.named() if checked else (),
        )

    def step(self, step: int, batch: Batch = None, *, micro_batches: Sequence[Batch] | None = None) -> StepReport:
        """Forward, backward, checks and veto for one optimizer step of a plain loop.

        ``batch`` is this rank's micro-batch; with gradient accumulation pass ``micro_batches=[...]`` instead (each
        loss is divided by their number, as an accumulating loop would; DDP synchronises on the last one). On commit
        the gradients are in ``.grad``; on a vetoed step ``.grad`` is None. ``loss_fn`` receives the model as given
        (the guard wraps a plain module of a distributed job in DDP); replays receive the module without wrapper.
        """
        if (batch is None) == (micro_batches is None):
            raise BadInput("pass exactly one of batch or micro_batches")
        mbs = [batch] if micro_batches is None else list(micro_batches)
        if not mbs:
            raise BadInput("micro_batches is empty")
        if self.role == "worker" and not self.comm.alone and not (is_ddp(self.model) or is_fsdp(self.model)):
            self.model = wrap_ddp(self.module, self.group)  # the framework's reduction, overlapped with the backward
        self.begin_step(step, micro_batches=len(mbs))
        losses = []
        try:
            for i, mb in enumerate(mbs):
                last = i == len(mbs) - 1
                with self.model.no_sync() if is_ddp(self.model) and not last else contextlib.nullcontext():
                    self.before_forward(mb)
                    loss = check_loss(self.loss_fn(self.model, mb))
                    self.observe_loss(loss)
                    (loss / len(mbs) if len(mbs) > 1 else loss).backward()
                losses.append(loss.detach())
        except BaseException:
            self._observer.finish()
            if self._checksums.active:
                self._checksums.end()
            raise
        return self.end_step(loss=losses[0] if len(losses) == 1 else torch.stack(losses).mean())

    def after_optimizer_step(self) -> list[Incident]:
        """Compare the weights across replicas when the schedule says so (call it after ``optimizer.step()``)."""
        every = self.config.weight_check_every
        if self.role != "worker" or not every or self._last_step is None or self._last_step % every:
            return []
        if not self._replica.active:
            return []
        weights = self.taps.weights()
        gathered = self.comm.gather_ints(self._replica.column(weights, self.device))[:, 0].tolist()
        found = [
            self._outcomes.rollback(i, vetoed=False)
            for i in self._replica.incidents("weight_replica", self._last_step, weights, gathered)
        ]
        self._verification.weights_compared(self._last_step, agreed=not found)
        self._responder.handle(found)
        return found

    # ---------------------------------------------------------------------------------------- internals

    def _warn_unjudged(self) -> None:
        if not self._warned_unjudged and self.dp_rank == 0:
            self._warned_unjudged = True
            warnings.warn(
                "sdcguard: a sampled micro-batch's local gradients were not seen on their own (its "
                "backward reduced nothing, or the step accumulated micro-batches without reducing them: "
                "FSDP2 set_requires_gradient_sync(False)); such samples are not judged. Keep gradient "
                "sync on for accumulation to have them checked",
                RuntimeWarning,
                stacklevel=3,
            )

    def _timing_columns(self) -> torch.Tensor:
        if self._clock is None:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        self._clock.settle()
        return torch.tensor(self._clock.columns(), dtype=torch.int64, device=self.device)

    def _replay(self, cap: Capture, same_process: bool, values: Sequence[torch.Tensor] | None = None) -> Digest:
        self.replaying = True
        try:
            with self._clock.replay() if self._clock is not None else contextlib.nullcontext():
                return replay(
                    self.taps,
                    self.loss_fn,
                    cap,
                    device=self.device,
                    rng_hook=self.rng_hook,
                    same_process=same_process,
                    params=self.params,
                    param_values=values,
                )
        finally:
            self.replaying = False

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
        """The last step every rank's checks vouched for: every rank's latest clean sample is at or after it, and no
        incident since then may have reached the weights (see :mod:`.verdicts.verification`). None before every rank was
        sampled cleanly, or when replay is off."""
        return self._verification.last_verified_step

    def record_checkpoint(self, checkpoint_id: str, step: int, digest: str = "") -> bool:
        """Remember a checkpoint of the state after ``step`` (``sdcguard.checkpoint.save`` calls it on every rank);
        whether that state is verified. Later incidents name the newest verified checkpoint to restart from; with a
        fleet store, the group's first rank records it there."""
        verified = self._verification.note_checkpoint(checkpoint_id, step).verified
        self._responder.record_checkpoint(checkpoint_id, step, verified, digest)
        return verified

    @property
    def nondeterministic(self) -> bool:
        """True once replays on this setup proved not bit-identical (replay checks are then off)."""
        return self._determinism.state == "nondeterministic"

    def calibrate(self, batch: Batch) -> CalibrationReport:
        """Compute one clean micro-batch (the first rank's ``batch``) twice on every rank: does the setup replay bit
        for bit, and does every device agree?

        Touches neither ``.grad`` nor the random streams. Every worker calls it (collective). Software is blamed
        only when two or more devices disagree with themselves: replay checks then turn off and the report names the
        likely causes. A device that disagrees with the majority is named in an incident (kind ``calibration``) and
        handled like any other; a disagreement nobody can settle is ``unresolved``."""
        if self.role != "worker":
            raise RuntimeError("calibrate() runs on the data-parallel workers")
        cap = make_capture(step=-1, rank=self.dp_rank, micro_batch=0, batch=batch, rng=capture_rng(self.rng_hook))
        report, j = calibrate(
            self.comm,
            lambda c, same: self._replay(c, same),
            cap,
            self.device,
            record_ops=not self.taps.collective_replay,
            setups=self.setups,
        )
        found: list[Incident] = []
        if report.verdict == "deterministic":
            self._determinism.state = "deterministic"
        elif report.verdict == "software":
            self._determinism.declare(f"calibrate(): {report}", list(report.causes))
        elif j is not None and report.verdict == "hardware":
            found += self._attr.replay_incidents(-1, [(self.members[0], j)], kind="calibration")
        elif j is not None:
            found.append(self._attr.unresolved(-1, self.members[0], j, alone=len(j.suspects) >= self.dp_size))
        self._responder.handle(found, escalate=self._outcomes.escalating(found))
        return report

    def serve(self) -> int:
        """On a dedicated shadow rank: replay the samples workers send until every worker calls ``close()``."""
        if self.role != "shadow":
            raise RuntimeError("guard.serve() runs on dedicated shadow ranks only")
        return ShadowServer(self.params, self._replay, num_workers=self.dp_size).serve()

    def close(self) -> list[Incident]:
        """End of training: collect outstanding shadow verdicts, release the shadows, remove the hooks."""
        if self._closed:
            return []
        self._closed = True
        found: list[Incident] = []
        if self.role == "worker":
            for result in self._round.close():
                found += [self._outcomes.rollback(i, vetoed=False) for i in self._outcomes.settled(result)]
            self._responder.handle(found, escalate=self._outcomes.escalating(found))
        if self._checksums.active:
            self._checksums.end()
        self.taps.close()
        return found

    def state_dict(self) -> dict[str, Any]:
        """Counters a resumed run needs (the sample counter drives pairings and micro-batch choice)."""
        return {
            "version": 2,
            "steps": self._steps,
            "samples": self._samples,
            "last_step": self._last_step,
            "slow": self._slow.state_dict() if self._slow is not None else {},
            "determinism": self._determinism.state_dict(),
            "verification": self._verification.state_dict(),
            "unresolved": sorted(self._outcomes.unresolved),
            "incidents": len(self.incidents),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") not in (1, 2):
            raise BadInput(f"unknown SDCGuard state version {state.get('version')!r}")
        self._steps, self._samples, self._last_step = int(state["steps"]), int(state["samples"]), state["last_step"]
        if state["version"] == 1:
            self._determinism.load_state_dict({"state": "nondeterministic" if state["nondeterministic"] else "unknown"})
        else:
            self._determinism.load_state_dict(state["determinism"])
            self._verification.load_state_dict(state.get("verification", {}))
            self._outcomes.unresolved = {int(r) for r in state.get("unresolved", ())}
            if self._slow is not None:
                self._slow.load_state_dict(state.get("slow", {}))
