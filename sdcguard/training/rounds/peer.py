"""The sampled step in peer mode: every data-parallel rank replays another rank's micro-batch, and a disagreement is
settled by every device computing the owner's micro-batch once more.

Round 1 (every sampled step): each rank replays its peer's micro-batch (:mod:`.pairing`); the captures travel point
to point (one send and one receive per rank); the digests ride in the guard's one per-step all-gather
(:meth:`PeerRound.columns`). In a single process the replay is a rerun on the same device.

Settling (only after a mismatch; the decision is taken from gathered values, so every rank enters it together), for
every mismatching micro-batch: the owner broadcasts its capture, every rank recomputes it (the owner's and the
replayer's recomputations show whether each reproduces itself; the others are third opinions), the opinions are gathered
and :func:`~..verdicts.attribution.judge` gives the verdict. Settling stops at the first software verdict (the setup
does not replay: nothing more can be learnt from replays). FSDP2 replays are collective; every rank takes part in every
replay here, so that holds too.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ...fingerprints import combine, signed64
from ...records import Incident
from ..comm import Comm
from ..digest import Digest
from ..mesh import Layout
from ..replay.capture import Capture
from ..replay.observe import Observed
from ..replay.recompute import Replayer
from ..verdicts.attribution import Attributor, Judgement, Opinion, judge
from ..verdicts.calibration import OpRecorder
from ..verdicts.outcomes import RoundResult, conclude
from ..verdicts.units import first_to_differ, join_units, narrowed
from .pairing import peer_source, peer_target

__all__ = ["PeerRound", "COLUMNS", "SettleOpinion", "SliceVerdict", "JUDGED"]

COLUMNS = 7
"""int64 values a rank adds to the per-step gather on a sampled step: original (units, loss, loss known), replay
(units, loss, loss known), and whether the original could be observed on its own."""


@dataclass(frozen=True, kw_only=True)
class SettleOpinion:
    """What a rank contributes when a mismatching micro-batch is settled: its rerun (and the aten ops it ran), its
    original when it owns the micro-batch, its round-1 replay when it replayed it."""

    rerun: Digest
    ops: tuple[str, ...] = ()
    original: Digest | None = None
    replay: Digest | None = None


@dataclass
class _Sampled:
    sample: int
    capture: Capture
    original: Digest
    replay: Digest


JUDGED = 6
"""Index, among a rank's :data:`COLUMNS`, of whether its original could be observed on its own."""


def _cols(d: Digest) -> list[int]:
    return [signed64(combine(d.units)), signed64(d.loss or 0), int(d.loss is not None)]


def _same(orig: Sequence[int], rep: Sequence[int]) -> bool:
    return orig[0] == rep[0] and (not (orig[2] and rep[2]) or orig[1] == rep[1])


@dataclass(frozen=True, kw_only=True)
class SliceVerdict:
    """What one rank says, job-wide, of a settled micro-batch: its slice's judgement (None where its slice saw no
    disagreement) and the ops its slice's reruns ran."""

    slice: int
    judgement: Judgement | None
    ops: tuple[str, ...] = ()
    traces: tuple[tuple[int, ...], ...] = ()
    """Its slice's computations of the micro-batch (the original, the replay, every rank's rerun), each one's
    contributions to its unit's collectives (:mod:`..replay.collectives`)."""


class PeerRound:
    """Round 1 and the settling of one sampled step in peer mode (or in one process).

    ``comm`` is this rank's data-parallel group (its slice of ``layout``); ``job`` the whole job, over which the
    step's table is gathered. Without tensor parallelism the two are one group. With it, every slice settles every
    micro-batch any slice disagrees on, so every tensor-parallel group replays together (their collectives in
    lockstep), and the slices' judgements are joined by tensor-parallel group (:mod:`..verdicts.units`).
    """

    def __init__(
        self,
        comm: Comm,
        replay_fn: Replayer,
        attributor: Attributor,
        *,
        record_ops: bool,
        collective: bool,
        setups: Mapping[int, Hashable] | None = None,
        job: Comm | None = None,
        layout: Layout | None = None,
    ) -> None:
        self.comm = comm
        self.replay_fn = replay_fn
        self.attr = attributor
        self.record_ops = record_ops
        """Record the aten ops of settling reruns (not under FSDP: its replays run collectives)."""
        self.collective = collective
        """Replays run collectives (FSDP2, tensor parallelism): every rank's original reads the same ones."""
        self.setups = setups
        self.job = job if job is not None else comm
        self.layout = layout if layout is not None else Layout(ranks=tuple(comm.members), slices=(tuple(comm.members),))
        self._state: _Sampled | None = None

    def records(self, sample: int) -> bool:
        return True

    def columns(self, step: int, sample: int, sampled: bool, observed: Observed | None) -> list[int]:
        """Replay this rank's peer's micro-batch; the columns this rank adds to the step's gather."""
        self._state = None
        if not sampled:
            return []
        assert observed is not None, "in peer mode every rank records its sampled micro-batch"
        W, me = self.comm.size, self.comm.index
        cap = observed.capture
        if W == 1:
            theirs, same = cap, True
        else:
            theirs = self.comm.exchange_objects(cap, dst=peer_target(me, sample, W), src=peer_source(me, sample, W))
            same = False
        mine = self.replay_fn(theirs, same)
        original = observed.record.digest()
        self._state = _Sampled(sample=sample, capture=cap, original=original, replay=mine)
        return _cols(original) + _cols(mine) + [int(observed.valid)]

    def finish(self, step: int, sample: int, sampled: bool, table: Sequence[Sequence[int]]) -> list[RoundResult]:
        """Compare every original with its replay (``table``: the job's rows, in the layout's rank order) and settle
        the disagreements."""
        st, self._state = self._state, None
        if st is None:
            return []
        layout, W = self.layout, self.layout.width
        rows = dict(zip(layout.ranks, table))
        pairs = [(peer_source(r, st.sample, W), r) for r in range(W)]
        seen: set[int] = set()
        bad: dict[int, list[int]] = {}  # owner's index -> the slices that saw its original differ from its replay
        unjudged = False
        for i, s in enumerate(layout.slices):
            judged = [(p, r) for p, r in pairs if rows[s[p]][JUDGED]]  # an original not seen on its own: not judged
            unjudged |= len(judged) < W
            seen |= {s[p] for p, _ in judged}
            for p, r in judged:
                if not _same(rows[s[p]][:3], rows[s[r]][3:6]):
                    bad.setdefault(p, []).append(i)
        result = RoundResult(step=step, unjudged=unjudged)
        if not bad:
            result.clean = seen
            return [result]
        settled: list[tuple[int, Judgement]] = []
        for p in sorted(bad):
            joined = self._settle_everywhere(st, p, peer_target(p, st.sample, W), bad[p], result)
            settled += joined
            if any(j.verdict == "software" for _, j in joined):
                break
        conclude(
            step,
            settled,
            self.attr,
            devices=max(len(layout.ranks), 1),
            shared_cause_at=2 if self.collective else 3,
            result=result,
        )
        if not result.software:
            result.clean = seen - result.blamed - result.suspects
        return [result]

    def escalate(
        self, action: Literal["raise", "exit"], incidents: Sequence[Incident], status: Callable[[int], int]
    ) -> None:
        """Every rank of a peer round takes part in the step: each raises or exits on its own."""

    def reform(self, plan: Any, incidents: Sequence[Incident]) -> None:
        """Every rank of a peer round takes part in the recovery itself."""

    def _settle_everywhere(
        self, st: _Sampled, p: int, r: int, disagreeing: Sequence[int], result: RoundResult
    ) -> list[tuple[int, Judgement]]:
        """Every slice settles the micro-batch of its ``p``-th rank (so tensor-parallel groups recompute together);
        the judgements of the ``disagreeing`` slices, joined by tensor-parallel group."""
        j, ops, traces = self._settle(st, p, r)
        if not self.layout.meshed:
            result.ops |= ops
            return [(self.comm.members[p], j)]
        mine = self.layout.slices.index(self.layout.slice_of(self.comm.rank))
        judgement = j if mine in disagreeing else None
        verdict = SliceVerdict(slice=mine, judgement=judgement, ops=tuple(sorted(ops)), traces=traces)
        everyone: list[SliceVerdict] = self.job.gather_objects(verdict)
        by_slice = {v.slice: v for v in everyone}
        result.ops |= {op for v in by_slice.values() for op in v.ops}
        # the slices whose ranks first put differing values into their units' collectives hold the fault's start
        first = first_to_differ({i: v.traces for i, v in by_slice.items()})
        judged = [(i, self.layout.slices[i][p], by_slice[i].judgement) for i in disagreeing]
        judged_here = narrowed([(i, o, jj) for i, o, jj in judged if jj is not None], first, self.layout.unit_word)
        return join_units(judged_here, self.layout.unit_of, self.layout.unit_word)

    def close(self) -> list[RoundResult]:
        return []

    def _settle(self, st: _Sampled, p: int, r: int) -> tuple[Judgement, set[str], tuple[tuple[int, ...], ...]]:
        W, me, g = self.comm.size, self.comm.index, self.comm.members
        cap = self.comm.broadcast_object(st.capture if me == p else None, src=p)
        recorder = OpRecorder() if self.record_ops else None
        if recorder is not None:
            with recorder:
                rerun = self.replay_fn(cap, me == p)
        else:
            rerun = self.replay_fn(cap, me == p)
        mine = SettleOpinion(
            rerun=rerun,
            ops=tuple(sorted(recorder.seen)) if recorder else (),
            original=st.original if me == p else None,
            replay=st.replay if me == r else None,
        )
        everyone: list[SettleOpinion] = self.comm.gather_objects(mine)
        ops = {op for e in everyone for op in e.ops}
        owner, replayer = everyone[p].original, everyone[r].replay
        assert owner is not None and replayer is not None  # the owner and the replayer sent theirs
        original = Opinion(g[p], owner)
        # the replay first, then every device's rerun (the owner's and the replayer's show self-consistency)
        others = [Opinion(g[r], replayer)] + [Opinion(g[q], everyone[q].rerun) for q in range(W)]
        traces = (owner.trace, replayer.trace, *(e.rerun.trace for e in everyone))
        return judge(original, others, self.setups), ops, traces
