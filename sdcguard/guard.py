"""``SDCGuard``: the training-side detector. One call per step runs forward, backward, the checks and the veto.

What happens in ``guard.step(step, batch)`` on every data-parallel rank:

1. Each micro-batch's forward and backward run through ``loss_fn`` and ``torch.autograd.grad`` into fresh
   tensors: the *local* gradients, before any reduction. The guard computes them itself rather than reading
   DDP's buckets from a comm hook: the replay then runs the very same code (so healthy hardware agrees bit for
   bit), there is no bucket layout to mirror, a user's own comm hook is never displaced, and the original is
   exactly the computation being checked. The price: the gradient all-reduce runs after the backward pass
   instead of overlapping with it, and DDP's forward hooks (buffer broadcast) are not used; a DDP-wrapped model
   is unwrapped and ``loss_fn`` receives the inner module.
2. The guard all-reduces the accumulated local gradients itself (bucketed, averaged over the group).
3. Every step: exact fingerprints of the reduced gradient buckets are compared across replicas (one small
   all-gather); on a difference ``ReplicaCheck`` names the minority rank(s) and the first differing parameter.
   This sees corruption after the reduction (collective, memory).
4. Sampled steps (one in ``replay_every``): a replay of one micro-batch on another device, compared bit for bit
   with the original (:mod:`sdcguard.shadows` for who replays whom, :mod:`sdcguard.replay` for the replay).
   A disagreement is settled by a third opinion and a re-run on the original device (transient or sticky).
5. The veto: with ``on_detect="skip"`` no rank commits a corrupted step. Every rank decides alike with no
   collective of its own, because every input of the decision came out of the collectives above.

The gradients land in ``.grad`` only when the step commits. ``after_optimizer_step()`` compares the weights
across replicas on its own schedule.

Exit-code contract (``on_detect="exit"``): every rank of the data-parallel group leaves at the same step, so no
rank waits on a dead peer. Ranks named as suspects exit with :data:`EXIT_SUSPECT_DEVICE` (86): "do not restart on
this node"; the others with :data:`EXIT_RESTART` (85): "restart me (without the suspect node)". A suspect rank
also writes the incidents as JSON lines to ``$SDCGUARD_SUSPECT_FILE`` when that variable is set, so a node-level
wrapper around ``torchrun`` can tell "leave the job" from "rejoin" (see the README).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from .attribution import Attributor, Conflict, job_id
from .calibration import CalibrationReport, calibrate
from .capture import Batch, Capture, RngHook, RngState, capture_rng, make_capture
from .devices import hostname
from .errors import BadInput, CorruptionDetected
from .fingerprint import _MASK64, _signed64
from .records import Incident
from .replica import ReplicaCheck, local_device_id
from .replay import Digest, LossFn, digest, first_mismatch, local_gradients, param_fingerprints, replay
from .shadows import (
    VERDICT_LEN,
    ShadowSample,
    ShadowServer,
    Verdict,
    exchange_objects,
    flatten_params,
    peer_source,
    peer_target,
    send_sample,
    send_stop,
    shadow_assignment,
    unflatten_params,
)

__all__ = [
    "SDCGuard",
    "GuardConfig",
    "StepReport",
    "CalibrationReport",
    "OnDetect",
    "EXIT_SUSPECT_DEVICE",
    "EXIT_RESTART",
]

OnDetect = Literal["record", "skip", "raise", "exit"]

EXIT_SUSPECT_DEVICE = 86
"""Exit status of a rank whose device was named as a suspect (``on_detect="exit"``): do not restart it here."""
EXIT_RESTART = 85
"""Exit status of the other ranks (``on_detect="exit"``): the job should restart without the suspect node."""

_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket size: few collectives, bounded extra memory
_MAX_PENDING = 2  # samples a dedicated shadow may lag behind before the workers wait for its oldest verdict

@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """Validated settings of a guard (``SDCGuard`` builds it from its keyword arguments)."""

    replay_every: int = 50
    """Replay one step in N (0: never)."""
    shadows: Literal["peer"] | tuple[int, ...] = "peer"
    """``"peer"``: data-parallel ranks replay each other; or the global ranks of dedicated shadows."""
    weight_check_every: int = 100
    """Compare the weights across replicas every N steps in ``after_optimizer_step`` (0: never)."""
    store: str | None = None
    """Path of the fleet store that incidents are recorded in (by the group's first rank)."""
    on_detect: OnDetect = "skip"
    """``record``: only record; ``skip``: no rank commits a corrupted step; ``raise``: raise
    ``CorruptionDetected`` on every rank; ``exit``: every rank exits (see the module's exit-code contract)."""

    def __post_init__(self) -> None:
        if not isinstance(self.replay_every, int) or self.replay_every < 0:
            raise BadInput(f"replay_every must be an integer >= 0, got {self.replay_every!r}")
        if not isinstance(self.weight_check_every, int) or self.weight_check_every < 0:
            raise BadInput(f"weight_check_every must be an integer >= 0, got {self.weight_check_every!r}")
        if self.on_detect not in ("record", "skip", "raise", "exit"):
            raise BadInput(f"on_detect must be record, skip, raise or exit, got {self.on_detect!r}")
        if self.shadows != "peer":
            if isinstance(self.shadows, str) or not all(isinstance(r, int) and r >= 0 for r in self.shadows):
                raise BadInput(f'shadows must be "peer" or a list of ranks, got {self.shadows!r}')
            if not self.shadows or len(set(self.shadows)) != len(self.shadows):
                raise BadInput(f"shadows must name at least one rank, each once, got {list(self.shadows)}")


@dataclass(frozen=True, kw_only=True)
class StepReport:
    """What ``guard.step`` found."""

    step: int
    loss: torch.Tensor
    """The step's loss (mean over its micro-batches), detached."""
    commit: bool
    """False when the optimizer must not apply this step (identical on every rank)."""
    incidents: tuple[Incident, ...] = ()
    """Incidents found during this call (a dedicated shadow's verdict may name an earlier step)."""
    replayed: bool = False
    """Whether this step was a sampled (replayed) step."""


@dataclass
class _Pending:
    """A sample sent to a dedicated shadow, waiting for its verdict (every worker keeps the metadata)."""

    sample: int
    step: int
    worker: int  # index in the data-parallel group
    shadow: int  # global rank
    # only on the sending worker:
    handles: list[Any] = field(default_factory=list)
    verdict: torch.Tensor | None = None
    verdict_work: Any = None
    capture: Capture | None = None
    flats: list[torch.Tensor] = field(default_factory=list)
    original: Digest | None = None


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
        rng_hook: RngHook | None = None,
    ) -> None:
        self.config = GuardConfig(
            replay_every=replay_every,
            shadows="peer" if shadows == "peer" else tuple(shadows),
            weight_check_every=weight_check_every,
            store=None if store is None else os.fspath(store),
            on_detect=on_detect,
        )
        self.model = model
        self.module: nn.Module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        self.loss_fn = loss_fn
        self.rng_hook = rng_hook
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        if not named:
            raise BadInput("the model has no parameter that requires a gradient")
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.device = self.params[0].device
        self.incidents: list[Incident] = []
        self.nondeterministic = False
        """True once ``calibrate`` found replays not bit-identical: mismatches become ``nondeterministic``."""
        self._steps = 0
        self._samples = 0
        self._last_step: int | None = None
        self._pending: collections.deque[_Pending] = collections.deque()
        self._flats: list[torch.Tensor] = []
        self._closed = False
        self._setup_groups(group)
        self._attr = Attributor(self.members, self.param_names, self.identities)
        # Cross-replica checks of reduced gradients and weights (collective to build: every worker builds it).
        self._replica: ReplicaCheck | None = None
        if self.distributed and self.role == "worker" and self.dp_size > 1:
            self._replica = ReplicaCheck(self.module, group=self.group, job=job_id())

    # ------------------------------------------------------------------------------------------------ setup

    def _setup_groups(self, group: Any) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        shadows = self.config.shadows
        if not self.distributed:
            if shadows != "peer":
                raise BadInput("dedicated shadows need torch.distributed to be initialised")
            self.rank, self.group, self.members, self.role, self.shadow_ranks = 0, None, [0], "worker", ()
        else:
            self.rank = dist.get_rank()
            world = dist.get_world_size()
            if shadows == "peer":
                self.group = group
                self.members = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
                self.role = "worker"
                self.shadow_ranks = ()
            else:
                if any(r >= world for r in shadows):
                    raise BadInput(f"shadow ranks {list(shadows)} are not all below the world size {world}")
                self.shadow_ranks = tuple(shadows)
                workers = [r for r in range(world) if r not in shadows]
                if not workers:
                    raise BadInput("every rank is a shadow: at least one worker is needed")
                if group is None:
                    # new_group is collective over the world: every rank (shadows too) builds the guard here, and
                    # every rank must pass group=None (or every rank the group from plan_roles).
                    group = dist.new_group(ranks=workers)
                self.role = "shadow" if self.rank in shadows else "worker"
                self.group = group if self.role == "worker" else None
                if self.role == "worker" and dist.get_process_group_ranks(group) != workers:
                    raise BadInput("with dedicated shadows, group must hold exactly the non-shadow ranks")
                self.members = workers
        self.dp_size = len(self.members)
        self.dp_rank = self.members.index(self.rank) if self.role == "worker" else -1
        me = (local_device_id(self.device), hostname())
        if not self.distributed:
            everyone: list[Any] = [me]
            ranks = [0]
        elif self.shadow_ranks:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, me)
            ranks = list(range(dist.get_world_size()))
        else:
            everyone = [None] * self.dp_size
            dist.all_gather_object(everyone, me, group=self.group)
            ranks = self.members
        self.identities: dict[int, tuple[str | None, str]] = dict(zip(ranks, everyone))

    # ------------------------------------------------------------------------------------------- the step

    def step(self, step: int, batch: Batch = None, *, micro_batches: Sequence[Batch] | None = None) -> StepReport:
        """Forward, backward, checks and veto for one optimizer step.

        ``batch`` is this rank's micro-batch; with gradient accumulation pass ``micro_batches=[...]`` instead (the
        loss of each is scaled by ``1/len(micro_batches)``, as an accumulating loop would). On commit, the
        averaged gradients are in ``.grad`` (added to what is there); on a vetoed step ``.grad`` is untouched.
        """
        if self.role != "worker":
            raise RuntimeError("a dedicated shadow rank runs guard.serve(), not guard.step()")
        if (batch is None) == (micro_batches is None):
            raise BadInput("pass exactly one of batch or micro_batches")
        mbs = [batch] if micro_batches is None else list(micro_batches)
        if not mbs:
            raise BadInput("micro_batches is empty")
        every = self.config.replay_every
        sampled = every > 0 and step % every == 0
        sample = self._samples
        chosen = sample % len(mbs)  # which micro-batch this sample replays: rotates with gradient accumulation
        if self.shadow_ranks:
            first_worker = shadow_assignment(sample, self.dp_size, len(self.shadow_ranks))[0]
            capture_here = sampled and self.dp_rank == first_worker
        else:
            capture_here = sampled
        scale = 1.0 / len(mbs)

        cap: Capture | None = None
        original: Digest | None = None
        original_grads: list[torch.Tensor] = []
        acc: list[torch.Tensor] | None = None
        losses: list[torch.Tensor] = []
        for i, mb in enumerate(mbs):
            if capture_here and i == chosen:
                cap = make_capture(
                    step=step, rank=self.dp_rank, micro_batch=i, batch=mb, rng=capture_rng(self.rng_hook),
                    loss_scale=scale,
                )
            loss, grads = local_gradients(self.module, self.loss_fn, self.params, mb, scale)
            if capture_here and i == chosen:
                # A dedicated shadow needs per-parameter fingerprints now; a peer computes them on a mismatch only.
                original = digest(loss, grads, per_param=bool(self.shadow_ranks))
                original_grads = grads
            losses.append(loss)
            if acc is None:
                # keep the chosen micro-batch's own gradients intact: accumulation adds into acc in place
                acc = [g.clone() for g in grads] if original_grads is grads and len(mbs) > 1 else grads
            else:
                for a, g in zip(acc, grads):
                    a.add_(g)
        assert acc is not None
        mean_loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        reduced = self._all_reduce(acc)

        # The reduced gradients go into .grad now (the cross-replica check reads them there) and come out again
        # on a veto: what was in .grad before is kept aside, not modified.
        before = [p.grad for p in self.params]
        with torch.no_grad():
            for p, g in zip(self.params, reduced):
                p.grad = g.view_as(p) if p.grad is None else p.grad + g.view_as(p)
        found, arrived = self._check_reduced(step, self._flats)
        if sampled:
            found += self._sampled_round(step, sample, cap, original, original_grads)
        commit = self._commit(step, found)
        if not commit:
            for p, g in zip(self.params, before):
                p.grad = g
        found += self._collect_arrived(arrived)
        self._steps += 1
        self._last_step = step
        self._handle(found)
        return StepReport(step=step, loss=mean_loss, commit=commit, incidents=tuple(found), replayed=sampled)

    def check(self, step: int, batch: Batch, *, rng: RngState | None = None) -> StepReport:
        """Check a step whose forward and backward a framework ran (the Lightning and Hugging Face adapters).

        Call it after the backward pass, before the optimizer step, with the step's last micro-batch and the
        random state captured just before its forward (``capture_rng()``). The reduced gradients in ``.grad`` are
        compared across replicas; on a sampled step this rank re-runs the micro-batch on its own device as the
        original and a peer (or a dedicated shadow) replays it. Unlike :meth:`step` the original is a re-run, so
        a one-off transient in the framework's own backward is not seen; a faulty device (sticky or intermittent)
        and corruption after the reduction are. ``.grad`` is left as it is: on ``commit=False`` the caller drops
        the gradients (the adapters set them to None, so the optimizer step changes nothing).
        """
        if self.role != "worker":
            raise RuntimeError("a dedicated shadow rank runs guard.serve(), not guard.check()")
        every = self.config.replay_every
        sampled = every > 0 and step % every == 0
        sample = self._samples
        found, arrived = self._check_reduced(step, [p.grad for p in self.params])
        loss = torch.full((), float("nan"))
        if sampled:
            cap: Capture | None = None
            original: Digest | None = None
            grads: list[torch.Tensor] = []
            if not self.shadow_ranks or self.dp_rank == shadow_assignment(
                    sample, self.dp_size, len(self.shadow_ranks))[0]:
                cap = make_capture(step=step, rank=self.dp_rank, micro_batch=0, batch=batch,
                                   rng=rng if rng is not None else capture_rng(self.rng_hook))
                original = self._replay(cap, same_process=True, keep=grads,
                                        per_param=bool(self.shadow_ranks))
            found += self._sampled_round(step, sample, cap, original, grads)
        commit = self._commit(step, found)
        found += self._collect_arrived(arrived)
        self._steps += 1
        self._last_step = step
        self._handle(found)
        return StepReport(step=step, loss=loss, commit=commit, incidents=tuple(found), replayed=sampled)

    def _sampled_round(self, step: int, sample: int, cap: Capture | None, original: Digest | None,
                       original_grads: list[torch.Tensor]) -> list[Incident]:
        try:
            if self.shadow_ranks:
                return self._dedicated_round(step, sample, cap, original)
            assert cap is not None and original is not None
            return self._peer_round(step, sample, cap, original, original_grads)
        finally:
            self._samples += 1

    def after_optimizer_step(self) -> list[Incident]:
        """Compare the weights across replicas when the schedule says so (call it after ``optimizer.step()``)."""
        every = self.config.weight_check_every
        if self.role != "worker" or not every or self._last_step is None or self._last_step % every:
            return []
        found = self._replica.check_weights(self._last_step) if self._replica is not None else []
        self._handle(found)
        return found

    # ------------------------------------------------------------------------------------- collectives

    def _all_reduce(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Average the local gradients over the group: one all-reduce per flat bucket (DDP's bucket size).

        The flat buckets are kept in ``self._flats`` for the cross-replica check; the returned gradients are views
        into them.
        """
        self._flats = []
        if not self.distributed or self.dp_size == 1:
            return grads
        out: list[torch.Tensor | None] = [None] * len(grads)
        bucket: list[int] = []
        size = 0

        def flush() -> None:
            nonlocal bucket, size
            if not bucket:
                return
            flat = torch.cat([grads[i].reshape(-1) for i in bucket])
            dist.all_reduce(flat, group=self.group)
            flat.div_(self.dp_size)
            self._flats.append(flat)
            offset = 0
            for i in bucket:
                n = grads[i].numel()
                out[i] = flat[offset : offset + n].view_as(grads[i])
                offset += n
            bucket, size = [], 0

        for i, g in enumerate(grads):
            if bucket and (g.dtype != grads[bucket[0]].dtype or g.device != grads[bucket[0]].device
                           or size + g.numel() * g.element_size() > _BUCKET_BYTES):
                flush()
            bucket.append(i)
            size += g.numel() * g.element_size()
        flush()
        return [t for t in out if t is not None]

    def _check_reduced(self, step: int, tensors: Sequence[torch.Tensor | None]) -> tuple[list[Incident], int]:
        """Every step: are the reduced gradients bit-identical on every replica?

        Fast path: one fingerprint per tensor given (the flat buckets in ``step``, each parameter's ``.grad`` in
        ``check``) and one small all-gather. Only when one differs (the outcome is the same on every rank, so the
        collectives line up) does ``ReplicaCheck`` compare per parameter, name the minority rank(s) and the
        first differing parameter. The same all-gather announces a dedicated shadow's verdict that has arrived
        at the worker that asked for it (see :meth:`_arrived`), which is returned with the incidents.
        """
        arrived = self._arrived()
        if self._replica is None:
            return [], arrived
        table = self._replica.gather(tensors, extra=[arrived]).tolist()
        arrived = max(row[-1] for row in table)
        rows = [row[:-1] for row in table]
        if all(row == rows[0] for row in rows):
            return [], arrived
        found = self._replica.check_gradients(step)
        if not found:
            found = [self._attr.incident(
                "gradient_replica", step, (), f"step {step}: the reduced gradients differ across replicas, but "
                "no single parameter does (inconsistent fingerprints)")]
        return found, arrived

    def _commit(self, step: int, found: list[Incident]) -> bool:
        """The veto: False when this step is corrupted and ``on_detect`` is not ``record``.

        Every input of the decision came out of collectives (gathered fingerprints and digests, broadcast
        verdicts), so every rank holds the same incidents and reaches the same decision with no collective of
        its own.
        """
        corrupted = any(i.kind != "nondeterministic" and i.step == step for i in found)
        return not (corrupted and self.config.on_detect != "record")

    def _arrived(self) -> int:
        """``1 +`` the sample number of the oldest pending shadow sample when this worker sent it and its verdict
        has arrived (non-blocking); 0 otherwise."""
        if not self._pending or self._pending[0].worker != self.dp_rank:
            return 0
        return self._pending[0].sample + 1 if self._pending[0].verdict_work.is_completed() else 0

    def _collect_arrived(self, arrived: int) -> list[Incident]:
        """Settle the shadow verdict announced in this step's all-gather, if it is still the oldest pending one
        (a full queue may have collected it already). Every worker decides alike: the value was gathered."""
        if arrived and self._pending and self._pending[0].sample == arrived - 1:
            return self._collect()  # an earlier step's verdict: reported now, never vetoes this one
        return []

    def _comm_device(self) -> torch.device:
        backend = str(dist.get_backend(self.group)).lower()
        return self.device if "nccl" in backend else torch.device("cpu")

    def _gather(self, obj: Any) -> list[Any]:
        if not self.distributed or self.dp_size == 1:
            return [obj]
        out: list[Any] = [None] * self.dp_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _gather_digests(self, original: Digest, replayed: Digest) -> list[tuple[Digest, Digest]]:
        """Every rank's (original, replay) digests with one fixed-size all-gather (no pickling): the integers
        ride as the extra columns of ``ReplicaCheck.gather``, the collective of the every-step check."""
        assert self._replica is not None  # peer rounds with more than one replica
        n = 1 + len(original.buckets)
        values = [original.loss, *original.buckets, replayed.loss, *replayed.buckets]
        table = self._replica.gather([], extra=[_signed64(v) for v in values])
        rows = [[v & _MASK64 for v in row] for row in table.tolist()]
        return [(Digest(loss=r[0], buckets=tuple(r[1:n])), Digest(loss=r[n], buckets=tuple(r[n + 1:])))
                for r in rows]

    def _broadcast(self, obj: Any, src: int) -> Any:
        """Broadcast an object from data-parallel index ``src``."""
        if not self.distributed or self.dp_size == 1:
            return obj
        box = [obj if self.dp_rank == src else None]
        dist.broadcast_object_list(box, src=self.members[src], group=self.group)
        return box[0]

    # ------------------------------------------------------------------------------------- peer replay

    def _replay(self, cap: Capture, *, same_process: bool, values: Sequence[torch.Tensor] | None = None,
                keep: list[torch.Tensor] | None = None, per_param: bool = False) -> Digest:
        return replay(self.module, self.loss_fn, self.params, cap, device=self.device, rng_hook=self.rng_hook,
                      same_process=same_process, param_values=values, keep=keep, per_param=per_param)

    def _peer_round(
        self, step: int, sample: int, cap: Capture, original: Digest, original_grads: list[torch.Tensor]
    ) -> list[Incident]:
        W, me = self.dp_size, self.dp_rank
        if W == 1:
            kept: list[torch.Tensor] = []
            again = self._replay(cap, same_process=True, keep=kept)
            if again == original:
                return []
            mm = first_mismatch(replace(original, params=param_fingerprints(original_grads)),
                                replace(again, params=param_fingerprints(kept)))
            assert mm is not None
            c = Conflict(owner=0, other=0, other_global=self.members[0], original=original,
                          parameter=mm.index, loss_differs=mm.loss_differs)
            if self.nondeterministic:
                return [self._attr.nondeterministic(step, c)]
            return self._attr.settle_single(step, c)
        src, dst = peer_source(me, sample, W), peer_target(me, sample, W)
        theirs: Capture = exchange_objects(cap, dst=self.members[dst], src=self.members[src], group=self.group)
        replay_grads: list[torch.Tensor] = []
        mine = self._replay(theirs, same_process=False, keep=replay_grads)
        gathered = self._gather_digests(original, mine)
        pairs = [(peer_source(r, sample, W), r) for r in range(W)]
        pairs = [(p, r) for p, r in pairs if gathered[p][0] != gathered[r][1]]
        if not pairs:
            return []
        # Name the first differing parameter: the two sides fingerprint their kept gradients per parameter.
        mine_params = {
            "original": param_fingerprints(original_grads) if any(p == me for p, _ in pairs) else None,
            "replay": param_fingerprints(replay_grads) if any(r == me for _, r in pairs) else None,
        }
        per_param = self._gather(mine_params)
        conflicts: list[Conflict] = []
        for p, r in pairs:
            a = replace(gathered[p][0], params=per_param[p]["original"])
            b = replace(gathered[r][1], params=per_param[r]["replay"])
            mm = first_mismatch(a, b)
            assert mm is not None
            conflicts.append(Conflict(owner=p, other=r, other_global=self.members[r], original=gathered[p][0],
                                       parameter=mm.index, loss_differs=mm.loss_differs))
        if self.nondeterministic:
            return [self._attr.nondeterministic(step, c) for c in conflicts]
        results = []
        for c in conflicts:  # identical list on every rank: the rounds below line up
            assert c.other is not None
            owner_cap = self._broadcast(cap if me == c.owner else None, src=c.owner)
            third = self._third(c.owner, c.other)
            mine_op: dict[str, Digest] = {}
            if me == c.owner:
                mine_op["rerun"] = self._replay(owner_cap, same_process=True)
            if me == c.other:
                mine_op["replayer_rerun"] = self._replay(owner_cap, same_process=False)
            if me == third:
                mine_op["third"] = self._replay(owner_cap, same_process=False)
            opinions = self._gather(mine_op)
            replica = gathered[c.other][1]
            results.append(self._attr.settle(
                c, replica=replica, third=None if third is None else opinions[third]["third"], third_rank=third,
                rerun=opinions[c.owner]["rerun"], other_rerun=opinions[c.other]["replayer_rerun"],
            ))
        return self._attr.merge(step, results)

    def _third(self, a: int, b: int) -> int | None:
        for k in range(1, self.dp_size):
            t = (b + k) % self.dp_size
            if t not in (a, b):
                return t
        return None

    # --------------------------------------------------------------------------------- dedicated shadows

    def _dedicated_round(self, step: int, sample: int, cap: Capture | None, original: Digest | None) -> list[Incident]:
        found: list[Incident] = []
        while len(self._pending) >= _MAX_PENDING:  # the shadow fell behind: wait for its oldest verdict
            found += self._collect()
        w, s = shadow_assignment(sample, self.dp_size, len(self.shadow_ranks))
        pending = _Pending(sample=sample, step=step, worker=w, shadow=self.shadow_ranks[s])
        if self.dp_rank == w:
            assert cap is not None and original is not None
            flats, layout = flatten_params(self.params)
            msg = ShadowSample(sample=sample, step=step, capture=cap, original=original, flat_layout=layout)
            pending.handles = send_sample(msg, flats, pending.shadow)
            pending.verdict = torch.zeros(VERDICT_LEN, dtype=torch.int64, device=self._comm_device())
            pending.verdict_work = dist.irecv(pending.verdict, src=pending.shadow)
            pending.capture, pending.flats, pending.original = cap, flats, original
        self._pending.append(pending)
        return found

    def _collect(self) -> list[Incident]:
        """Every worker: fetch the oldest pending verdict (the sender waits for it) and settle a mismatch."""
        if not self._pending:
            return []
        pending = self._pending.popleft()
        buf = torch.zeros(VERDICT_LEN, dtype=torch.int64, device=self._comm_device())
        if self.dp_rank == pending.worker:
            pending.verdict_work.wait()
            for work in pending.handles[0][0] + pending.handles[1]:
                work.wait()
            buf.copy_(pending.verdict)
        if self.dp_size > 1:
            dist.broadcast(buf, src=self.members[pending.worker], group=self.group)
        verdict = Verdict.from_tensor(buf)
        if verdict.matched:
            return []
        c = Conflict(owner=pending.worker, other=None, other_global=pending.shadow,
                      original=pending.original or Digest(loss=0, buckets=()), parameter=verdict.first_index,
                      loss_differs=verdict.loss_differs)
        if self.nondeterministic:
            return [self._attr.nondeterministic(pending.step, c)]
        payload = None
        if self.dp_rank == pending.worker:
            payload = (pending.capture, [f.cpu() for f in pending.flats], pending.original)
        owner_cap, flats, original = self._broadcast(payload, src=pending.worker)
        c = Conflict(owner=c.owner, other=None, other_global=c.other_global, original=original,
                      parameter=c.parameter, loss_differs=c.loss_differs)
        values = unflatten_params([f.to(self.device) for f in flats], self.params)
        third = (pending.worker + 1) % self.dp_size if self.dp_size > 1 else None
        mine_op: dict[str, Digest] = {}
        if self.dp_rank == pending.worker:
            mine_op["rerun"] = self._replay(owner_cap, same_process=True, values=values)
        if self.dp_rank == third:
            mine_op["third"] = self._replay(owner_cap, same_process=False, values=values)
        opinions = self._gather(mine_op)
        settled = self._attr.settle(
            c, replica=None, replica_hash=verdict.shadow_hash,
            third=None if third is None else opinions[third]["third"],
            third_rank=third, rerun=opinions[pending.worker]["rerun"], other_rerun=None,
        )
        return self._attr.merge(pending.step, [settled])

    def serve(self) -> int:
        """On a dedicated shadow rank: replay the samples workers send until every worker calls ``close()``."""
        if self.role != "shadow":
            raise RuntimeError("guard.serve() runs on dedicated shadow ranks only")
        server = ShadowServer(self.module, self.loss_fn, self.params, num_workers=self.dp_size,
                              device=self.device, rng_hook=self.rng_hook)
        return server.serve()

    def close(self) -> list[Incident]:
        """End of training: collect the outstanding shadow verdicts and release the shadows (every worker)."""
        if self._closed or self.role != "worker":
            return []
        self._closed = True
        found: list[Incident] = []
        if self.shadow_ranks:
            while self._pending:
                found += self._collect()
            self._handle(found)
            for s in self.shadow_ranks:
                send_stop(s)
        return found

    # ------------------------------------------------------------------------------------------ actions

    def _handle(self, found: list[Incident]) -> None:
        if not found:
            return
        self.incidents.extend(found)
        self._record(found)
        actionable = [i for i in found if i.kind != "nondeterministic"]
        if not actionable:
            return
        if self.config.on_detect == "raise":
            raise CorruptionDetected(
                f"silent data corruption: {actionable[0].detail}", tuple(actionable))
        if self.config.on_detect == "exit":
            suspect = any(self.rank in i.suspect_ranks for i in actionable)
            if suspect and os.environ.get("SDCGUARD_SUSPECT_FILE"):
                with contextlib.suppress(OSError):
                    with open(os.environ["SDCGUARD_SUSPECT_FILE"], "a", encoding="utf-8") as f:
                        for i in actionable:
                            f.write(json.dumps(asdict(i)) + "\n")
            print(f"sdcguard: {actionable[0].detail}", file=sys.stderr, flush=True)
            sys.exit(EXIT_SUSPECT_DEVICE if suspect else EXIT_RESTART)

    def _record(self, found: list[Incident]) -> None:
        # One writer per group: every rank holds the same incidents.
        if self.config.store is None or self.dp_rank != 0:
            return
        try:
            from .store import Store

            with Store.open(self.config.store) as store:
                for incident in found:
                    store.record_incident(incident)
        except Exception as e:  # never crash training over bookkeeping: the incident stays in memory
            warnings.warn(f"sdcguard: could not record {len(found)} incident(s) in {self.config.store}: {e}; "
                          "they are kept in guard.incidents", RuntimeWarning, stacklevel=3)

    # -------------------------------------------------------------------------------------- calibration

    def calibrate(self, batch: Batch) -> CalibrationReport:
        """Replay one clean step on each rank and across ranks: are the results bit-identical?

        Touches neither ``.grad`` nor the random streams. When not identical, the guard is marked
        ``nondeterministic``: later replay mismatches are reported as ``nondeterministic`` incidents and never
        veto a step or blame a device. Every worker calls it (collective). See :mod:`sdcguard.calibration`.
        """
        if self.role != "worker":
            raise RuntimeError("calibrate() runs on the data-parallel workers")
        return calibrate(self, batch)

    # ------------------------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Counters a resumed run needs (the sample counter drives pairings and micro-batch choice)."""
        return {"version": 1, "steps": self._steps, "samples": self._samples, "last_step": self._last_step,
                "nondeterministic": self.nondeterministic, "incidents": len(self.incidents)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1:
            raise BadInput(f"unknown SDCGuard state version {state.get('version')!r}")
        self._steps = int(state["steps"])
        self._samples = int(state["samples"])
        self._last_step = state["last_step"]
        self.nondeterministic = bool(state["nondeterministic"])
