"""Dedicated shadow ranks: hot spares that replay sampled micro-batches while the workers go on (the roles are
:mod:`.roles`, what travels between them :mod:`.wire`).

On a sampled step one worker (samples rotate over the workers and the shadows) sends a shadow its micro-batch,
random states and digest, then its parameters from a staging copy (one flat buffer per dtype, on the communication
device, allocated once and reused: the optimizer may change the live tensors while the sends are in flight, and a
busy shadow must never hold a worker up; one message per dtype, not per tensor). The shadow receives the
parameters into its own module, replays, and
sends a small verdict back; the workers pick it up at the first step after it arrived (the per-step all-gather
carries an "arrived" value, so nobody waits) and wait only when the shadow falls more than :data:`MAX_PENDING`
samples behind, or when the staging copy is still being sent as the next sample comes.

A shadow holds one copy of the parameters: its module's. When its replay disagrees with the worker's original it
keeps that sample (capture, digest, parameter values) until the workers fetch it to settle the disagreement: every
worker recomputes the sample at those values and a majority decides (:func:`~..verdicts.attribution.judge`). A shadow's
verdict names a step that was already applied: a shadow cannot veto.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ...errors import CorruptionDetected
from ...records import Incident
from ..comm import (
    Comm,
    comm_device,
    irecv_tensor,
    recv_object,
    recv_tensors_,
    send_object,
    send_stop,
    send_tensor,
    send_tensors,
)
from ..digest import Digest
from ..replay.capture import Capture
from ..replay.observe import Observed
from ..replay.recompute import Replayer
from ..verdicts.attribution import Attributor, Opinion, judge
from ..verdicts.outcomes import RoundResult, conclude
from .pairing import shadow_assignment
from .wire import VERDICT_LEN, Escalation, Fetch, Reform, ShadowSample, Verdict, flat_buffers, flat_views

__all__ = ["ShadowServer", "DedicatedRound", "ShadowSettle", "MAX_PENDING"]

MAX_PENDING = 2
"""Samples a shadow may lag behind before the workers wait for its oldest verdict."""


class ShadowServer:
    """The loop a dedicated shadow rank runs until every worker has stopped (``SDCGuard.close()``)."""

    def __init__(self, params: Sequence[nn.Parameter], replay_fn: Replayer, *, num_workers: int) -> None:
        self.params = list(params)
        self.replay_fn = replay_fn
        self.num_workers = num_workers
        self.replays = 0
        # The module's own parameters become views into one flat buffer per dtype: the parameters a worker sends
        # land there directly (one message per dtype) and the shadow holds one copy of them.
        self._flats = flat_buffers(self.params, comm_device(None))
        with torch.no_grad():
            for p, view in zip(self.params, flat_views(self._flats, self.params)):
                view.copy_(p)
                p.data = view
        self._kept: dict[int, tuple[Capture, Digest, list[torch.Tensor]]] = {}
        self.reform: Reform | None = None
        """The workers' recovery plan when :meth:`serve` returned for one (:class:`~.wire.Reform`)."""

    def serve(self) -> int:
        """Serve until every worker has stopped, or sent a recovery plan (:attr:`reform`); returns the number of
        samples replayed. When the workers escalate (they raise or exit: :class:`~.wire.Escalation`), so does the
        shadow, once every worker has said so: ``CorruptionDetected``, or ``SystemExit`` with the exit-code
        contract's status."""
        stopped: set[int] = set()
        escalation: Escalation | None = None
        self.reform = None
        while len(stopped) < self.num_workers:
            msg, sender = recv_object(None)
            if msg is None:
                stopped.add(sender)
            elif isinstance(msg, Reform):
                stopped.add(sender)
                self.reform = msg
                self._kept.clear()
            elif isinstance(msg, Escalation):
                stopped.add(sender)
                escalation = msg
            elif isinstance(msg, Fetch):
                cap, digest, values = self._kept.pop(msg.sample)
                handles = send_object((cap, digest), sender)
                for w in handles[0] + send_tensors(values, sender):
                    w.wait()
            else:
                self._replay(msg, sender)
        if escalation is not None:
            _act(escalation)
        return self.replays

    def _replay(self, sample: ShadowSample, sender: int) -> None:
        with torch.no_grad():
            recv_tensors_(self._flats, sender)
        mine = self.replay_fn(sample.capture, False, None)
        matched = mine == sample.original
        if not matched:  # kept until the workers fetch it to settle the disagreement
            self._kept[sample.sample] = (sample.capture, mine, [f.clone() for f in self._flats])
        first = None if matched else sample.original.first_difference(mine)
        loss_differs = not matched and mine.loss is not None and sample.original.loss not in (None, mine.loss)
        verdict = Verdict(
            sample=sample.sample, step=sample.step, matched=matched, first_unit=first, loss_differs=loss_differs
        )
        send_tensor(verdict.to_tensor(comm_device(None)), sender)
        self.replays += 1


def _act(escalation: Escalation) -> None:
    """What the workers did, on the shadow (the exit status is the one the workers' contract gives it)."""
    first = escalation.incidents[0].detail if escalation.incidents else "the workers escalated"
    if escalation.action == "exit":
        print(f"sdcguard: {first}", file=sys.stderr, flush=True)
        sys.exit(escalation.status)
    raise CorruptionDetected(f"silent data corruption: {first}", escalation.incidents)


class Arrival:
    """Whether a non-blocking receive has completed, without waiting for it.

    NCCL answers ``is_completed()`` (a CUDA event query). Gloo's point-to-point receive only learns it has
    completed inside ``wait()``, so for a receive on the CPU a daemon thread waits for it and sets a flag.
    """

    def __init__(self, work: Any, device: torch.device) -> None:
        self.work = work
        self._event: threading.Event | None = None
        if device.type == "cpu":
            self._event = threading.Event()
            threading.Thread(target=self._wait_then_set, daemon=True, name="sdcguard-verdict").start()

    def _wait_then_set(self) -> None:
        try:
            self.work.wait()
        finally:
            assert self._event is not None
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set() if self._event is not None else bool(self.work.is_completed())

    def wait(self) -> None:
        if self._event is not None:
            self._event.wait()
        else:
            self.work.wait()


@dataclass(frozen=True, kw_only=True)
class ShadowSettle:
    """What a worker contributes when a shadow's disagreement is settled: its two reruns, and the owner's original."""

    reruns: tuple[Digest, ...]
    original: Digest | None


@dataclass
class _Pending:
    """A sample sent to a shadow, waiting for its verdict (every worker keeps the metadata)."""

    sample: int
    step: int
    worker: int  # index in the data-parallel group
    shadow: int  # global rank
    # only on the sending worker:
    verdict: torch.Tensor | None = None
    verdict_work: Arrival | None = None
    original: Digest | None = None


class DedicatedRound:
    """The workers' side of dedicated shadows (see the module docstring)."""

    def __init__(
        self,
        comm: Comm,
        shadows: Sequence[int],
        params: Sequence[nn.Parameter],
        replay_fn: Replayer,
        attributor: Attributor,
    ) -> None:
        self.comm = comm
        self.shadows = tuple(shadows)
        self.params = list(params)
        self.replay_fn = replay_fn
        self.attr = attributor
        self._pending: collections.deque[_Pending] = collections.deque()
        self._staging: list[torch.Tensor] = []
        self._in_flight: tuple[list[Any], Any] = ([], None)
        """The previous sample's sends (to wait on) and the buffers they read (kept alive until then)."""
        self._ready: list[RoundResult] = []
        """Verdicts collected while sending (the shadow fell behind), reported at this step's finish."""
        self._released = False
        """The shadows were told this worker is done (``close``) or escalates (``escalate``)."""

    def owner(self, sample: int) -> int:
        """Data-parallel index of the worker whose micro-batch the sample checks."""
        return shadow_assignment(sample, self.comm.size, len(self.shadows))[0]

    # ------------------------------------------------------------------------------------- the Round protocol

    def records(self, sample: int) -> bool:
        return self.owner(sample) == self.comm.index

    def columns(self, step: int, sample: int, sampled: bool, observed: Observed | None) -> list[int]:
        """On a sampled step the owner sends its sample to a shadow; every step, whether a verdict arrived."""
        if sampled:
            self._ready += self.send(step, sample, observed)
        return [self.arrived()]

    def finish(self, step: int, sample: int, sampled: bool, table: Sequence[Sequence[int]]) -> list[RoundResult]:
        ready, self._ready = self._ready, []
        return ready + self.collect_arrived(max(row[0] for row in table))

    def send(self, step: int, sample: int, observed: Observed | None) -> list[RoundResult]:
        """A sampled step: the owner sends its micro-batch and parameters; every worker notes the pending sample.
        Waits for the oldest verdicts first when the shadow fell behind (their results are returned)."""
        if self._released:  # the shadows left with the escalation (a script that caught it and goes on)
            return []
        results = []
        while len(self._pending) >= MAX_PENDING:
            results.append(self.collect())
        w, s = shadow_assignment(sample, self.comm.size, len(self.shadows))
        pending = _Pending(sample=sample, step=step, worker=w, shadow=self.shadows[s])
        if self.comm.index == w:
            assert observed is not None
            original = observed.record.digest()
            msg = ShadowSample(sample=sample, step=step, capture=observed.capture, original=original)
            for work in self._in_flight[0]:  # the staging copy is free once the previous sample's sends are done
                work.wait()
            device = comm_device(None)
            if not self._staging:
                self._staging = flat_buffers(self.params, device)
            with torch.no_grad():
                for view, p in zip(flat_views(self._staging, self.params), self.params):
                    view.copy_(p)
            handles = send_object(msg, pending.shadow)
            self._in_flight = (handles[0] + send_tensors(self._staging, pending.shadow), handles)
            pending.verdict = torch.zeros(VERDICT_LEN, dtype=torch.int64, device=device)
            pending.verdict_work = Arrival(irecv_tensor(pending.verdict, pending.shadow), device)
            pending.original = original
        self._pending.append(pending)
        return results

    def arrived(self) -> int:
        """``1 +`` the oldest pending sample when this worker sent it and its verdict has arrived (no waiting)."""
        if not self._pending or self._pending[0].worker != self.comm.index:
            return 0
        work = self._pending[0].verdict_work
        assert work is not None  # set on the sending worker
        return self._pending[0].sample + 1 if work.done() else 0

    def collect_arrived(self, arrived: int) -> list[RoundResult]:
        """Settle the verdict announced in this step's gather (``arrived``: the gathered maximum), if it is still
        the oldest pending one (a full queue may have collected it already)."""
        if arrived and self._pending and self._pending[0].sample == arrived - 1:
            return [self.collect()]
        return []

    def collect(self) -> RoundResult:
        """Every worker: the oldest pending verdict (the sender waits for it), settled when it disagrees."""
        if not self._pending:
            return RoundResult()
        pending = self._pending.popleft()
        result = RoundResult(step=pending.step, vetoable=False)
        buf = torch.zeros(VERDICT_LEN, dtype=torch.int64, device=self.comm.device)
        if self.comm.index == pending.worker:
            assert pending.verdict_work is not None and pending.verdict is not None  # set on the sending worker
            pending.verdict_work.wait()
            buf.copy_(pending.verdict)
        self.comm.broadcast_tensors_([buf], src=pending.worker)
        if not Verdict.from_tensor(buf).matched:
            self._settle(pending, result)
        owner = self.comm.members[pending.worker]
        if not result.software and owner not in result.blamed | result.suspects:
            result.clean = {owner}
        return result

    def _settle(self, pending: _Pending, result: RoundResult) -> None:
        """Every worker recomputes the sample twice at the values the shadow replayed it at (twice: whether each
        device reproduces itself is the evidence that tells software from hardware), then the rule decides; the
        owner's original, computed steps ago, is judged against the verdict but is no evidence of how the owner
        computes now."""
        me, owner, g = self.comm.index, pending.worker, self.comm.members
        flats = flat_buffers(self.params, self.comm.device)
        values = flat_views(flats, self.params)
        payload = None
        if me == owner:
            request = send_object(Fetch(pending.sample), pending.shadow)
            for w in request[0]:
                w.wait()
            payload, _ = recv_object(pending.shadow)
            recv_tensors_(flats, pending.shadow)
        cap, shadow_digest = self.comm.broadcast_object(payload, src=owner)
        self.comm.broadcast_tensors_(flats, src=owner)
        reruns = [self.replay_fn(cap, me == owner, values) for _ in range(2)]
        everyone: list[ShadowSettle] = self.comm.gather_objects(
            ShadowSettle(reruns=tuple(reruns), original=pending.original)
        )
        others = [Opinion(pending.shadow, shadow_digest)] + [
            Opinion(g[q], d) for q in range(self.comm.size) for d in everyone[q].reruns
        ]
        original = everyone[owner].original
        assert original is not None  # the owner kept its original
        j = judge(Opinion(g[owner], original), others, contemporary=False)
        conclude(pending.step, [(g[owner], j)], self.attr, devices=self.comm.size + 1, shared_cause_at=3, result=result)

    def escalate(
        self, action: Literal["raise", "exit"], incidents: Sequence[Incident], status: Callable[[int], int]
    ) -> None:
        """The workers raise or exit at this step: tell every shadow (its last message from this worker), so the
        shadows leave ``serve()`` the same way instead of waiting for the workers forever; ``status(rank)``: a
        shadow's exit status under ``exit``. Outstanding verdicts are dropped: the job is ending."""
        if self._released:
            return
        self._released = True
        self._pending.clear()
        for s in self.shadows:
            handles = send_object(Escalation(action=action, incidents=tuple(incidents), status=status(s)), s)
            for w in handles[0]:
                w.wait()

    def reform(self, plan: Any, incidents: Sequence[Incident]) -> None:
        """The job recovers: wait for what is in flight to and from the shadows (a shadow answers every sample
        before it reads the plan), drop the outstanding verdicts, and tell every shadow the plan."""
        if self._released:
            return
        self._released = True
        for work in self._in_flight[0]:
            work.wait()
        for pending in self._pending:
            if pending.verdict_work is not None:
                pending.verdict_work.wait()
        self._pending.clear()
        for s in self.shadows:
            handles = send_object(Reform(plan=plan, incidents=tuple(incidents)), s)
            for w in handles[0]:
                w.wait()

    def close(self) -> list[RoundResult]:
        """End of training: collect every outstanding verdict, then release the shadows."""
        if self._released:  # escalated: the shadows are gone
            return []
        self._released = True
        results = []
        while self._pending:
            results.append(self.collect())
        for work in self._in_flight[0]:
            work.wait()
        for s in self.shadows:
            send_stop(s)
        return results
