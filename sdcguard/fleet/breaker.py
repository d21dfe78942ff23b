"""The circuit breakers: when failures point at the suite or the software, not at the hardware.

**The scanner's breaker** judges failed golden-case executions. Two devices with the same defect and the same
deterministic inputs can give the same wrong output, so an identical wrong output on several devices is not by
itself a suite problem. What tells them apart is what the *other* devices did with the same case:

- a **bad golden file** makes every device that uses it fail the case, all with the same output (the right
  one), so either the failing devices are a large share of those that ran the case, or their "wrong" output is
  exactly the output other devices pass the case with (a staged roll-out: the devices with the old, good file
  pass with the very output the devices with the bad file are told is wrong);
- a **batch of devices sharing one defect** is a few devices among many: most devices that ran the case in the
  same window passed it, and the batch's shared wrong output is no output anyone passes with.

So a wrong output shared by ``breaker_same_digest_devices`` or more devices blames the suite only when it is an
output the case passes with somewhere, or when more than ``breaker_share`` of the devices that ran the case in
that time bucket gave it; otherwise it is a shared defect and each device is judged on its own evidence. Failures
of any outputs by more than ``breaker_share`` (and at least ``breaker_min_devices``) of the devices that ran a
case in one bucket blame the suite or the software too (a driver update breaking a kernel). Failures blamed on
the suite are never evidence against a device, also after the breaker's window.

**The training breaker** judges training incidents, one job at a time (incidents without a job id are each their
own job: nothing is pooled across jobs). Software that slipped past the guard's rule of evidence leaves a pattern:
many devices of the job named, none reproducing its fault. When those are at least ``incident_breaker_devices``
devices and at least ``incident_breaker_share`` of the job's size, that job's transient incidents quarantine
nobody. Faulty hardware is a few devices of a job, or one that reproduced its fault (sticky, which always counts):
a job of thousands may hold several.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..durations import DAY_S
from ..records import NOT_EVIDENCE_KINDS, SLOW_KIND, Incident
from .store.rows import FailedExecution

if TYPE_CHECKING:
    from .store.failures import Failures

__all__ = [
    "BreakerSettings",
    "SuiteVerdict",
    "SuiteEvidence",
    "read_suite_evidence",
    "judge_suite",
    "suite_blamed_devices",
    "TrainingVerdict",
    "judge_training",
    "attributed",
]


class BreakerSettings(Protocol):
    """What the breakers read of the policy (:class:`~sdcguard.fleet.policy.QuarantinePolicy` has these fields and
    documents them); the breakers need nothing else of it, and the policy module imports this one."""

    @property
    def window_s(self) -> float: ...
    @property
    def breaker_window_s(self) -> float: ...
    @property
    def breaker_same_digest_devices(self) -> int: ...
    @property
    def breaker_share(self) -> float: ...
    @property
    def breaker_min_devices(self) -> int: ...
    @property
    def incident_breaker_devices(self) -> int: ...
    @property
    def incident_breaker_share(self) -> float: ...


@dataclass
class SuiteVerdict:
    """What the scanner's breaker made of the failures in the evidence window."""

    bucket_s: float
    trips: list[str] = field(default_factory=list)
    """One sentence per reason to trip now (suite-suspect failures inside the breaker window)."""
    suspect_digests: set[tuple[str, str]] = field(default_factory=set)
    """``(case, digest)``: wrong outputs blamed on the suite."""
    suspect_buckets: set[tuple[str, int]] = field(default_factory=set)
    """``(case, bucket)``: every failure of the case in that bucket is blamed on the suite."""
    shared: dict[tuple[str, str], str] = field(default_factory=dict)
    """``(case, digest)`` -> why an identical wrong output on several devices was judged a shared defect."""

    def is_suspect(self, f: FailedExecution) -> bool:
        """True when this failure is blamed on the suite (never evidence against its device)."""
        return (f.case, f.digest or "") in self.suspect_digests or (
            f.case,
            int(f.started_at // self.bucket_s),
        ) in self.suspect_buckets


def _not_exceeded_from(failing: int, share: float) -> int:
    """A count of devices ``total`` for which ``failing > share * total`` is false, as the breaker computes it in
    floats (the test is monotone in ``total``, so it is false for every larger one too), from ``failing / share``
    rounded down: the fewest but where rounding says otherwise."""
    total = max(1, math.floor(failing / share))
    while failing > share * total:
        total += 1
    return total


@dataclass(frozen=True)
class SuiteEvidence:
    """What the scanner's breaker weighs beside the failures (:func:`read_suite_evidence`): how many devices ran each
    failing case in the time buckets its verdict needs (for a bucket judged on its failures alone, counted only as far
    as the verdict needs: :meth:`~.store.failures.Failures.case_coverage`'s ``enough``), and every output each case
    that failed the same way on several devices passed with."""

    coverage: Mapping[tuple[str, int], int]
    """``(case, bucket) -> devices`` that ran the case in that bucket (a bucket nobody ran is not there)."""
    passes: Mapping[str, frozenset[str]]
    """``case -> every output digest it passed with``."""


@dataclass(frozen=True)
class _Questions:
    """What a verdict over ``failures`` needs to know of the other devices (the same for reading and judging)."""

    groups: dict[tuple[str, str], set[str]]
    """``(case, digest) -> devices`` that gave that wrong output, for those shared by enough devices."""
    wide: dict[tuple[str, int], set[str]]
    """``(case, bucket) -> devices`` that failed it there, for the buckets with enough failing devices."""
    exact: set[tuple[str, int]]
    """The buckets of the shared wrong outputs: their share is a figure in a message, so counted whole."""
    enough: dict[tuple[str, int], int]
    """A wide bucket judged alone: the count of devices past which its verdict cannot change."""


def _questions(failures: Sequence[FailedExecution], policy: BreakerSettings) -> _Questions:
    bucket = policy.breaker_window_s
    same: dict[tuple[str, str], set[str]] = defaultdict(set)
    failing: dict[tuple[str, int], set[str]] = defaultdict(set)
    for f in failures:
        if f.digest:
            same[(f.case, f.digest)].add(f.device)
        failing[(f.case, int(f.started_at // bucket))].add(f.device)
    groups = {k: v for k, v in same.items() if len(v) >= policy.breaker_same_digest_devices}
    wide = {k: v for k, v in failing.items() if len(v) >= policy.breaker_min_devices}
    exact = {(f.case, int(f.started_at // bucket)) for f in failures if (f.case, f.digest) in groups}
    # A wide bucket alone needs only whether its failing devices exceed the share of those that ran the case:
    # counting stops at the fewest devices that answer no (the same verdict for every larger count).
    enough = {k: _not_exceeded_from(len(v), policy.breaker_share) for k, v in wide.items() if k not in exact}
    return _Questions(groups=groups, wide=wide, exact=exact, enough=enough)


def read_suite_evidence(
    failures: Sequence[FailedExecution], policy: BreakerSettings, *, source: Failures, since: float
) -> SuiteEvidence:
    """Read from the store's failures job (``source``) what :func:`judge_suite` weighs beside ``failures`` (every
    device's failed first attempts since ``since``): nothing when no wrong output is shared and no bucket has enough
    failing devices to be judged."""
    q = _questions(failures, policy)
    if not q.groups and not q.wide:
        return SuiteEvidence(coverage={}, passes={})
    coverage = source.case_coverage(
        set(q.wide) | q.exact, since=since, bucket_s=policy.breaker_window_s, enough=q.enough
    )
    passes = source.pass_digests({c for c, _ in q.groups})
    return SuiteEvidence(
        coverage={(c.case, c.bucket): c.devices for c in coverage},
        passes={case: frozenset(digests) for case, digests in passes.items()},
    )


def judge_suite(
    failures: Sequence[FailedExecution], evidence: SuiteEvidence, policy: BreakerSettings, *, now: float
) -> SuiteVerdict:
    """Judge ``failures`` (every device's failed first attempts in the window ``evidence`` was read for) against
    what the other devices did with the same cases. A pure function of its arguments."""
    verdict = SuiteVerdict(bucket_s=policy.breaker_window_s)
    bucket = verdict.bucket_s
    recent = now - policy.breaker_window_s
    q = _questions(failures, policy)
    if not q.groups and not q.wide:
        return verdict
    ran = evidence.coverage
    for (case, digest), devices in sorted(q.groups.items()):
        hits = [f for f in failures if f.case == case and f.digest == digest]
        by_bucket: dict[int, set[str]] = defaultdict(set)
        for f in hits:
            by_bucket[int(f.started_at // bucket)].add(f.device)
        share = max(len(d) / max(ran.get((case, b), len(d)), 1) for b, d in by_bucket.items())
        if digest in evidence.passes.get(case, frozenset()):
            why = "the very output other devices pass it with (their golden file differs)"
        elif share > policy.breaker_share:
            why = f"{share:.0%} of the devices that ran it"
        else:
            others = max(ran.get((case, b), 0) for b in by_bucket) - len(devices)
            verdict.shared[(case, digest)] = (
                f"{len(devices)} devices gave this same wrong output while {max(others, 0)} others passed the "
                "case: a defect they share, not the suite"
            )
            continue
        verdict.suspect_digests.add((case, digest))
        if any(f.started_at >= recent for f in hits):
            verdict.trips.append(
                f"circuit breaker: case {case} gave the same wrong output (digest {digest[:12]}) on {len(devices)} "
                f"devices, {why}: the suite or the software is suspect, not the hardware; nobody quarantined"
            )
    latest: dict[tuple[str, int], float] = {}
    for f in failures:
        key = (f.case, int(f.started_at // bucket))
        latest[key] = max(latest.get(key, f.started_at), f.started_at)
    for (case, b), devices in sorted(q.wide.items()):
        total = ran.get((case, b), len(devices))
        if len(devices) > policy.breaker_share * total:
            verdict.suspect_buckets.add((case, b))
            if latest[(case, b)] >= recent:
                verdict.trips.append(
                    f"circuit breaker: {len(devices)} of {total} devices failed case {case} (more than "
                    f"{policy.breaker_share:.0%}): the suite or the software is suspect; nobody quarantined"
                )
    return verdict


def suite_blamed_devices(source: Failures, policy: BreakerSettings, *, since: float, now: float) -> dict[str, int]:
    """``device -> failures`` for each device that failed since ``since`` only in ways the breaker blames on the
    suite or the software (:func:`judge_suite` over every device's failures of the window, read from the store's
    failures job, ``source``): what the report must not call a ``suspect`` device, since those failures are never
    evidence against it."""
    failures = source.executions(since=since)
    verdict = judge_suite(failures, read_suite_evidence(failures, policy, source=source, since=since), policy, now=now)
    counts: dict[str, int] = defaultdict(int)
    cleared: dict[str, bool] = {}
    for f in failures:
        counts[f.device] += 1
        cleared[f.device] = cleared.get(f.device, True) and verdict.is_suspect(f)
    return {d: counts[d] for d, ok in cleared.items() if ok}


def attributed(incident: Incident) -> bool:
    """True when an incident singles out one device by majority: it names a device, exactly one suspect rank,
    and is of a kind that is evidence (not :data:`~sdcguard.records.NOT_EVIDENCE_KINDS`: a ``nondeterministic``
    replay never blames hardware, a ``nonfinite`` step has many causes, and so has a ``reduction`` one)."""
    return (
        incident.device is not None
        and len(incident.suspect_ranks) == 1
        and len({d for d in incident.devices if d} - {incident.device}) == 0
        and incident.kind not in NOT_EVIDENCE_KINDS
    )


@dataclass
class TrainingVerdict:
    """What the training breaker made of the incidents in the window."""

    tripped_jobs: dict[str, str] = field(default_factory=dict)
    """job -> why its incidents are not evidence."""
    counts: dict[str, int] = field(default_factory=dict)
    """device -> attributed incidents naming it, from jobs whose breaker did not trip."""


def judge_training(incidents: Sequence[Incident], policy: BreakerSettings) -> TrainingVerdict:
    """Trip the training breaker per job, and count the attributed incidents of the other jobs per device."""
    verdict = TrainingVerdict()
    jobs: dict[str, list[Incident]] = defaultdict(list)
    for n, i in enumerate(incidents):
        if i.kind == SLOW_KIND:  # a slow rank is not evidence of corruption
            continue
        jobs[i.job if i.job is not None else f"(no job id, incident {n})"].append(i)
    days = policy.window_s / DAY_S
    for job, found in sorted(jobs.items()):
        scattered = sorted(
            {x for i in found if not i.sticky for x in (i.device, *i.devices) if x}
            - {x for i in found if i.sticky for x in (i.device, *i.devices) if x}
        )
        size = max((i.job_size for i in found if i.job_size), default=None)
        if len(scattered) >= policy.incident_breaker_devices and (
            size is None or len(scattered) >= policy.incident_breaker_share * size
        ):
            of = f" of its {size}" if size else ""
            verdict.tripped_jobs[job] = (
                f"training circuit breaker: incidents of job {job} named {len(scattered)}{of} distinct devices in the "
                f"last {days:g} days, none reproducing its fault ({', '.join(scattered[:5])}"
                f"{', ...' if len(scattered) > 5 else ''}): software nondeterminism is suspect, not the hardware; "
                "nobody quarantined on this job's transient incidents"
            )
    for job, found in jobs.items():
        for i in found:  # a tripped job's sticky incidents still count: a device reproduced its fault
            if attributed(i) and (job not in verdict.tripped_jobs or i.sticky):
                assert i.device is not None
                verdict.counts[i.device] = verdict.counts.get(i.device, 0) + 1
    return verdict
