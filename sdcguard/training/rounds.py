"""The sampled step in peer mode: every data-parallel rank replays another rank's micro-batch, disagreements are
settled by every device recomputing the owner's micro-batch once more.

Round 1 (every sampled step): each rank replays its peer's micro-batch (:mod:`.pairing`); the captures travel point
to point (one send and one receive per rank); the digests ride in the guard's one per-step all-gather
(:meth:`PeerRound.columns`). In a single process the replay is a rerun on the same device.

Settling (only after a mismatch; the decision is taken from gathered values, so every rank enters it together):
the owner broadcasts its capture, every rank recomputes it (the owner's recomputation is its rerun; in a single
process the device reruns it once more), the opinions are gathered and :func:`~.attribution.judge` names the
device(s) a majority singles out, or none. More than two mismatching micro-batches at once cannot come from one
faulty device (it spoils at most its own and the one it replays), so they are not settled: software is suspect.
FSDP2 replays are collective; every rank takes part in every replay here, so that holds too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..fingerprints import combine
from ..records import Incident
from .attribution import Attributor, Judgement, Opinion, judge
from .calibration import OpRecorder
from .capture import Capture
from .comm import Comm
from .observe import Observed
from .pairing import peer_source, peer_target
from .taps import Digest

__all__ = ["PeerRound", "RoundResult", "ReplayFn", "COLUMNS"]

ReplayFn = Callable[[Capture, bool], Digest]
"""``replay(capture, same_process) -> Digest`` on this rank."""

COLUMNS = 7
"""int64 values a rank adds to the per-step gather on a sampled step: original (units, loss, loss known), replay
(units, loss, loss known), and whether the original could be observed on its own."""

_MAX_SETTLED = 2
_MASK64 = (1 << 64) - 1


@dataclass
class RoundResult:
    """What a sampled round found (identical on every rank)."""

    incidents: list[Incident] = field(default_factory=list)
    corrupt: bool = False
    """Some rank's original computation of this step was wrong: the step must not be committed."""
    unresolved: list[str] = field(default_factory=list)
    """Disagreements that no majority settled: software nondeterminism (or, with two devices, undecidable)."""
    ops: set[str] = field(default_factory=set)
    """aten ops seen while settling (to name order-dependent ones)."""
    blamed: set[int] = field(default_factory=set)
    """Global ranks named by this round."""
    clean: set[int] = field(default_factory=set)
    """Global ranks whose computation this round verified (their original agreed with its replay or the majority)."""
    step: int | None = None
    """The step those computations belong to (a dedicated shadow's verdict names an earlier one)."""


@dataclass
class _Sampled:
    sample: int
    capture: Capture
    original: Digest
    replay: Digest


def _signed(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def _cols(d: Digest) -> list[int]:
    return [_signed(combine(d.units)), _signed(d.loss or 0), int(d.loss is not None)]


def _same(orig: list[int], rep: list[int]) -> bool:
    return orig[0] == rep[0] and (not (orig[2] and rep[2]) or orig[1] == rep[1])


class PeerRound:
    """Round 1 and the settling of one sampled step in peer mode (or in one process)."""

    def __init__(self, comm: Comm, replay_fn: ReplayFn, attributor: Attributor, *, record_ops: bool) -> None:
        self.comm = comm
        self.replay_fn = replay_fn
        self.attr = attributor
        self.record_ops = record_ops
        """Record the aten ops of settling reruns (not under FSDP: its replays run collectives)."""

    def columns(self, sample: int, observed: Observed) -> tuple[list[int], _Sampled]:
        """Replay this rank's peer's micro-batch; the columns this rank adds to the step's gather."""
        W, me = self.comm.size, self.comm.index
        cap = observed.capture
        if W == 1:
            theirs, same = cap, True
        else:
            theirs = self.comm.exchange_objects(cap, dst=peer_target(me, sample, W), src=peer_source(me, sample, W))
            same = False
        mine = self.replay_fn(theirs, same)
        original = observed.record.digest()
        cols = _cols(original) + _cols(mine) + [int(observed.valid)]
        return cols, _Sampled(sample=sample, capture=cap, original=original, replay=mine)

    def finish(self, step: int, st: _Sampled, table: list[list[int]]) -> RoundResult:
        """Compare every original with its replay (``table``: this round's gathered columns, one row per rank) and
        settle the disagreements."""
        W = self.comm.size
        judged = [(peer_source(r, st.sample, W), r) for r in range(W)]
        judged = [(p, r) for p, r in judged if table[p][6]]  # an original not seen on its own cannot be judged
        seen = {self.comm.members[p] for p, _ in judged}
        bad = [(p, r) for p, r in judged if not _same(table[p][:3], table[r][3:6])]
        result = RoundResult(step=step)
        if not bad:
            result.clean = seen
            return result
        if len(bad) > _MAX_SETTLED:
            result.unresolved.append(f"{len(bad)} of {W} micro-batches computed differently on their replays at "
                                     "once (one faulty device spoils at most two)")
            result.ops = self._diagnose(st)
            return result
        settled = []
        for p, r in bad:
            j, ops = self._settle(st, p, r)
            result.ops |= ops
            if j.agreed is None:
                result.unresolved.append(f"rank {self.comm.members[p]}'s micro-batch at step {step}: {j.how}")
                continue
            result.corrupt |= j.original_corrupt
            result.blamed |= set(j.blamed)
            settled.append((self.comm.members[p], j))
        result.incidents = self.attr.replay_incidents(step, settled)
        if not result.unresolved:
            result.clean = seen - result.blamed
        return result

    def _diagnose(self, st: _Sampled) -> set[str]:
        """The aten ops of one rerun of each rank's own micro-batch (one extra replay, once per run: the guard then
        turns replay off), to name the order-dependent or random ones."""
        if not self.record_ops:
            return set()
        recorder = OpRecorder()
        with recorder:
            self.replay_fn(st.capture, True)
        return {op for ops in self.comm.gather_objects(sorted(recorder.seen)) for op in ops}

    def _settle(self, st: _Sampled, p: int, r: int) -> tuple[Judgement, set[str]]:
        W, me, g = self.comm.size, self.comm.index, self.comm.members
        cap = self.comm.broadcast_object(st.capture if me == p else None, src=p)
        recorder = OpRecorder() if self.record_ops else None
        if recorder is not None:
            with recorder:
                rerun = self.replay_fn(cap, me == p)
        else:
            rerun = self.replay_fn(cap, me == p)
        mine: dict[str, Any] = {"rerun": rerun, "ops": sorted(recorder.seen) if recorder else []}
        if me == p:
            mine["original"] = st.original
        if me == r:
            mine["replay"] = st.replay
        everyone = self.comm.gather_objects(mine)
        ops = {op for e in everyone for op in e["ops"]}
        original = Opinion(g[p], everyone[p]["original"])
        if W == 1:  # one device: the original, round 1's rerun and this one vote
            return judge(original, None, [Opinion(g[0], st.replay), Opinion(g[0], rerun)]), ops
        reruns = [Opinion(g[q], everyone[q]["rerun"]) for q in range(W)]
        return judge(original, Opinion(g[r], everyone[r]["replay"]), reruns), ops
