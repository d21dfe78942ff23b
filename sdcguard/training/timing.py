"""Slow ranks: the guard times each rank's step phases and compares devices that computed the same micro-batch.

What is timed, per rank and step, without synchronizing the stream beyond what the guard already does:

- **compute**: forward and backward, from ``begin_step`` to ``end_step``;
- **guard**: the guard's own work in ``end_step`` (fingerprints, the replay of a sampled step excluded);
- **wait**: the wall time spent in the guard's per-step all-gather (waiting for the slowest rank);
- **replay**: on a sampled step (peer mode), the replay of the peer's micro-batch.

Time is what the device did: the calling thread's CPU time on a CPU device (a preempted rank is not a slow one),
CUDA events on a GPU. Events are read one step later, after the gather's own host sync has passed them, so
reading them never waits: every figure rides the *next* step's gather, in :data:`COLUMNS` int64 columns.

The comparison (:func:`pair_slowdowns`): on a sampled step rank ``d`` computed its own micro-batch (the original)
and replayed its source's; its target replayed ``d``'s. ``d``'s micro-batch on ``d`` against the same micro-batch
on the target, and the source's micro-batch on ``d`` against it on the source: in the product of the two ratios the
micro-batches' sizes and the original-versus-replay overhead cancel, and what is left is ``d``'s speed against its
neighbours (``sqrt(a_d^2 / (a_target * a_source))``). One sample is noisy on a loaded machine (a few milliseconds
of work between other processes' time slices), so a rank is named when the distribution-free lower
confidence bound of its median slowdown over the last ``window`` samples (at least ``min_samples``; the same sign-test
bound as the fleet's, :func:`sdcguard.medians.median_lower_bound`) exceeds ``1 + threshold``: with 9 samples at
90%, seven of them above it. It is named once in an incident of kind ``slow`` (again only after it recovered).
Every rank holds the same gathered figures and decides alike. A ``slow`` incident never vetoes, never raises or
exits, and never counts toward quarantine or the training breaker (:data:`sdcguard.records.PASSIVE_KINDS`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from statistics import median
from typing import Any

import torch

from ..medians import median_lower_bound
from ..records import SLOW_KIND, Incident
from .rounds.pairing import peer_source, peer_target
from .step_check import CheckResult, StepState

__all__ = [
    "SlowWatch",
    "RankSlowness",
    "PhaseClock",
    "IdleClock",
    "TimingCheck",
    "SlowJudge",
    "pair_slowdowns",
    "COLUMNS",
]

COLUMNS = 6
"""int64 columns every rank adds to every step's gather: the sample the figures belong to (-1: none), original and
replay microseconds of that sample, and compute, guard and wait microseconds of the previous step."""


@dataclass(frozen=True, kw_only=True)
class SlowWatch:
    """When a rank is named slow (``SDCGuard(slow=...)``; ``None`` turns timing off)."""

    threshold: float = 0.25
    """Named when the lower bound of its median slowdown exceeds ``1 + threshold`` (25% slower than its
    neighbours; docs/guard.md says why not 20%: ``benchmarks/slow_training.py``)."""
    confidence: float = 0.9
    """Confidence of that lower bound."""
    window: int = 9
    """Samples remembered per rank."""
    min_samples: int = 5
    """Samples in the window before any verdict (a sampled step is one in ``replay_every``)."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 10:
            raise ValueError(f"slow threshold must be in (0, 10), got {self.threshold}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"slow confidence must be in [0.5, 1), got {self.confidence}")
        if not 1 <= self.min_samples <= self.window:
            raise ValueError(f"need 1 <= min_samples <= window, got {self.min_samples}, {self.window}")


@dataclass(frozen=True, kw_only=True)
class RankSlowness:
    """What the guard knows about one rank's speed (``guard.slowness``)."""

    rank: int
    samples: tuple[float, ...]
    """Its recent slowdowns, oldest first (1.0: as fast as the devices that computed the same micro-batches)."""
    lower_bound: float | None
    """The current lower confidence bound of their median (None: too few samples)."""
    peak_lower_bound: float | None
    """The highest that bound has been in this run: how close a clean rank came to being named."""
    named: bool


class _Span:
    """One timed span: thread CPU time on a CPU device, a pair of CUDA events on a GPU (read later)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.start: Any = None
        self.end: Any = None

    def begin(self) -> None:
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.thread_time()

    def stop(self) -> None:
        if self.cuda:
            self.end = torch.cuda.Event(enable_timing=True)
            self.end.record()
        else:
            self.end = time.thread_time()

    def micros(self) -> int:
        """Microseconds (0 when not measured); on CUDA only once the events completed (after a host sync)."""
        if self.start is None or self.end is None:
            return 0
        if self.cuda:
            return int(self.start.elapsed_time(self.end) * 1000) if self.end.query() else 0
        return int((self.end - self.start) * 1e6)


class PhaseClock:
    """This rank's phase times; ``columns()`` hands the finished figures to the next gather."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._compute = _Span(self.cuda)
        self._replay = _Span(self.cuda)
        self._guard_cpu = 0.0
        self._wait_s = 0.0
        self._wait_cpu = 0.0
        self._replay_guard_s = 0.0
        self._sample: int | None = None
        self._pending: list[int] = [-1, 0, 0, 0, 0, 0]
        self._pending_spans: tuple[int | None, _Span, _Span, float, float] | None = None
        self._replays = 0

    def begin_step(self) -> None:
        self._compute = _Span(self.cuda)
        self._compute.begin()
        self._replay = _Span(self.cuda)
        self._sample, self._replays, self._wait_s, self._wait_cpu, self._replay_guard_s = None, 0, 0.0, 0.0, 0.0

    def end_compute(self, sample: int | None) -> None:
        """``end_step`` begins: forward and backward are over; ``sample``: this step's sample number, if sampled."""
        self._compute.stop()
        self._sample = sample
        self._guard_cpu = time.thread_time()

    @contextmanager
    def replay(self) -> Iterator[None]:
        """Around a replay: the first of a step is the sampled one (settling reruns come later)."""
        first = self._replays == 0
        self._replays += 1
        t = time.thread_time()
        if first:
            self._replay.begin()
        try:
            yield
        finally:
            if first:
                self._replay.stop()
            self._replay_guard_s += time.thread_time() - t

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around the guard's gather."""
        t, c = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self._wait_s += time.perf_counter() - t
            self._wait_cpu += time.thread_time() - c

    def columns(self) -> list[int]:
        """The figures finished by now (the previous step's), for this step's gather."""
        return list(self._pending)

    def end_step(self) -> None:
        """``end_step`` is over: this step's figures wait for the next gather (CUDA events are complete by then)."""
        guard_s = max(0.0, time.thread_time() - self._guard_cpu - self._replay_guard_s - self._wait_cpu)
        self._pending_spans = (self._sample, self._compute, self._replay, guard_s, self._wait_s)

    def settle(self) -> None:
        """Before the next gather: read the previous step's spans into the pending columns."""
        spans = self._pending_spans
        if spans is None:
            return
        sample, compute, replay, guard_s, wait_s = spans
        c, r = compute.micros(), replay.micros()
        ok = sample is not None and c > 0 and r > 0
        self._pending = [
            -1 if sample is None or not ok else sample,
            c if ok else 0,
            r if ok else 0,
            c,
            int(guard_s * 1e6),
            int(wait_s * 1e6),
        ]
        self._pending_spans = None


class IdleClock(PhaseClock):
    """The clock of a guard that does not time (``slow=None``, dedicated shadows, one rank): every call does
    nothing, so the guard calls the clock alike either way."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))

    def begin_step(self) -> None:
        pass

    def end_compute(self, sample: int | None) -> None:
        pass

    @contextmanager
    def replay(self) -> Iterator[None]:
        yield

    @contextmanager
    def waiting(self) -> Iterator[None]:
        yield

    def end_step(self) -> None:
        pass


class TimingCheck:
    """Slowness as a step check (:mod:`sdcguard.training.step_check`, slice ``"timing"``): the previous step's
    figures ride this step's gather; a ``slow`` incident never vetoes."""

    name = "timing"

    def __init__(self, clock: PhaseClock, judge: SlowJudge, device: torch.device) -> None:
        self.clock = clock
        self.judge = judge
        self.device = device

    def columns(self, state: StepState) -> torch.Tensor:
        self.clock.settle()
        return torch.tensor(self.clock.columns(), dtype=torch.int64, device=self.device)

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        return CheckResult(incidents=tuple(self.judge.observe(state.step, rows)))


def pair_slowdowns(sample: int, original: Sequence[int], replayed: Sequence[int]) -> list[float | None]:
    """Per rank: its speed against the ranks that computed the same micro-batches at this sample (see the module
    docstring); None where a figure is missing."""
    W = len(original)
    out: list[float | None] = []
    for d in range(W):
        t, s = peer_target(d, sample, W), peer_source(d, sample, W)
        figures = (original[d], replayed[t], replayed[d], original[s])
        if W < 2 or min(figures) <= 0:
            out.append(None)
            continue
        index = math.log(original[d] / replayed[t]) + math.log(replayed[d] / original[s])
        out.append(math.exp(index / 2))
    return out


class SlowJudge:
    """Remembers each rank's recent slowdowns and names a rank consistently slower than its neighbours."""

    def __init__(
        self,
        watch: SlowWatch,
        members: Sequence[int],
        identities: Mapping[int, tuple[str | None, str]],
        *,
        job: str | None,
        job_size: int,
        slices: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.watch = watch
        self.members = list(members)
        """The ranks whose rows the gathered table holds, in its order."""
        self.slices = [list(s) for s in slices] if slices is not None else [self.members]
        """The data-parallel groups whose ranks computed each other's micro-batches (tensor parallelism: one per
        shard); without one, every member."""
        self.identities = identities
        self.job = job
        self.job_size = job_size
        self.history: dict[int, deque[float]] = {g: deque(maxlen=watch.window) for g in self.members}
        self.named: set[int] = set()
        self.peak: dict[int, float] = {}
        self.last_phases: dict[int, tuple[int, int, int]] = {}
        """Global rank -> (compute, guard, wait) microseconds of the latest step seen."""

    def observe(self, step: int, table: Sequence[Sequence[int]]) -> list[Incident]:
        """The timing columns of one gather (one row per rank, :data:`COLUMNS` each): incidents for newly slow
        ranks."""
        rows = dict(zip(self.members, table))
        for g, row in rows.items():
            self.last_phases[g] = (int(row[3]), int(row[4]), int(row[5]))
        samples = {int(row[0]) for row in table}
        if len(samples) != 1 or -1 in samples or len(table) < 2:
            return []
        (sample,) = samples
        ratios: list[tuple[int, float | None]] = []
        for s in self.slices:
            got = pair_slowdowns(sample, [int(rows[g][1]) for g in s], [int(rows[g][2]) for g in s])
            ratios += list(zip(s, got))
        found = []
        for g, x in ratios:
            if x is None:
                continue
            h = self.history[g]
            h.append(x)
            if len(h) < self.watch.min_samples:
                continue
            low = median_lower_bound([math.log(v) for v in h], self.watch.confidence)
            if low is not None:
                self.peak[g] = max(self.peak.get(g, 0.0), math.exp(low))
            if low is not None and low > math.log1p(self.watch.threshold) and g not in self.named:
                self.named.add(g)
                found.append(self._incident(step, g, median(h), math.exp(low)))
            elif median(h) <= 1 + self.watch.threshold / 2:
                self.named.discard(g)  # recovered: a later slowdown is named again
        return found

    def ranks(self) -> dict[int, RankSlowness]:
        """Every rank's figures (global rank -> :class:`RankSlowness`)."""
        out = {}
        for g, h in self.history.items():
            low = (
                median_lower_bound([math.log(v) for v in h], self.watch.confidence)
                if len(h) >= self.watch.min_samples
                else None
            )
            out[g] = RankSlowness(
                rank=g,
                samples=tuple(h),
                lower_bound=None if low is None else math.exp(low),
                peak_lower_bound=self.peak.get(g),
                named=g in self.named,
            )
        return out

    def _incident(self, step: int, g: int, m: float, low: float) -> Incident:
        device, host = self.identities.get(g, (None, ""))
        compute, guard, wait = self.last_phases.get(g, (0, 0, 0))
        seen = ", ".join(f"{x:.2f}x" for x in self.history[g])
        detail = (
            f"rank {g}{f' ({device})' if device else ''} is slow: it took {m:.2f}x the time of the devices that "
            f"computed the same micro-batches (median of its last {len(self.history[g])} samples: {seen}; "
            f"lower {self.watch.confidence:.0%} bound {low:.2f}x); "
            f"its last step: forward+backward {compute / 1e3:.1f} ms, the guard's own work {guard / 1e3:.1f} ms, "
            f"waiting in the guard's gather {wait / 1e3:.1f} ms. Not corruption: the step was not vetoed"
        )
        return Incident(
            kind=SLOW_KIND,
            step=step,
            suspect_ranks=(g,),
            device=device,
            devices=(device,) if device else (),
            hosts=(host,) if host else (),
            detail=detail,
            job=self.job,
            job_size=self.job_size,
            sticky=None,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"history": {str(g): list(h) for g, h in self.history.items()}, "named": sorted(self.named)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for g, xs in state.get("history", {}).items():
            if int(g) in self.history:
                self.history[int(g)].extend(float(x) for x in xs)
        self.named = {int(g) for g in state.get("named", ())}
