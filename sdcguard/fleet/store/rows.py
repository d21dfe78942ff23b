"""What the store's named queries return: small records, and the one definition of a device's status.

Every module that reads the fleet store (rates, policy, report, plot, merge) gets these from
:class:`sdcguard.fleet.store.store.Store` methods; none of them sees SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

__all__ = [
    "DeviceStatus",
    "device_status",
    "Tally",
    "FailedExecution",
    "CaseCoverage",
    "ScanCounts",
    "QuarantineEntry",
    "Decision",
    "PendingAction",
    "SeriesPoint",
    "MergeStats",
    "PruneStats",
    "SpoolBacklog",
    "DiagRecord",
    "DiagSummary",
    "NvmlScan",
    "CheckpointEntry",
    "ScrubEntry",
    "CheckpointStatus",
    "ScrubStatus",
    "CaseTiming",
    "CaseTimes",
]

DeviceStatus = Literal["healthy", "suspect", "quarantined", "probation"]
"""``quarantined``/``probation``: the quarantine table says so. ``suspect``: neither, but at least one failed
execution (first attempt) in the window, or named by a training incident in the window (alone, or as one of the
suspects of an unresolved one). ``healthy``: everything else (including never scanned)."""


def device_status(state: str | None, failed_in_window: bool) -> DeviceStatus:
    """The one definition of a device's status, from its quarantine state (None: no row) and whether it failed
    at least one execution, or was named by a training incident, in the window."""
    if state == "quarantined":
        return "quarantined"
    if state == "probation":
        return "probation"
    return "suspect" if failed_in_window else "healthy"


@dataclass(frozen=True, slots=True)
class Tally:
    """Executions summed over a group of rows (a device, a family, or a device and a family).

    ``executions`` and ``failures`` count first attempts only (a retest is run *because* of a failure and would
    bias the rate); ``test_s`` is every second of testing, retests included.
    """

    device: str | None
    family: str | None
    executions: int
    failures: int
    test_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class FailedExecution:
    """One failed first attempt, as the policy weighs it."""

    device: str
    case: str
    family: str
    digest: str | None
    sticky: bool | None
    started_at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseCoverage:
    """Who ran one case in one time bucket: the denominator of the circuit breaker's share rule."""

    case: str
    bucket: int
    """``int(started_at // bucket_s)``."""
    devices: int
    """Distinct devices with at least one execution of the case in the bucket."""


@dataclass(frozen=True, slots=True)
class ScanCounts:
    """A device's complete scans in a window, and its latest complete scan ever."""

    complete: int
    last_complete: float | None


@dataclass(frozen=True, kw_only=True)
class QuarantineEntry:
    """One row of the current quarantine state."""

    device: str
    state: Literal["quarantined", "probation"]
    since: float
    reason: str
    by: str
    host: str | None = None


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One decision of a policy run, as recorded in ``policy_decisions``."""

    device: str | None
    decision: str
    """``quarantine``, ``breaker``, ``training_breaker``, ``probation_passed``, ``action_failed``, ``action_ok``,
    ``slow`` (a device slower than its peers: a finding, not a quarantine)."""
    reason: str
    time: float | None = None
    """When it was recorded (filled in by :meth:`~.quarantine.Quarantine.decisions`)."""


@dataclass(frozen=True, kw_only=True)
class PendingAction:
    """An action not yet run successfully for a device's current quarantine."""

    id: int
    device: str
    action: str
    reason: str
    host: str


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """Executions and failures of one device (None: the whole fleet) in one time bin of a plot."""

    device: str | None
    bin: int
    executions: int
    failures: int


@dataclass(frozen=True, kw_only=True)
class MergeStats:
    """What one input brought to the output (0 everywhere when it had nothing new)."""

    source: str
    devices: int
    scans: int
    results: int
    incidents: int
    quarantine_history: int
    skipped_scans: int = 0
    """Scans older than the output's retention horizon: already rolled up there, not merged again."""
    rewound: tuple[str, ...] = ()
    """Tables of the input that went backwards since the last merge (the row at the watermark is gone or is
    another: its newest rows pruned, or the store restored from an older backup), so they were read in full."""


@dataclass(frozen=True, kw_only=True)
class DiagRecord:
    """One DCGM diagnostic test's result on one device, as ``store.diagnostics.record`` takes it."""

    device: str
    category: str
    test: str
    status: Literal["pass", "fail", "warn", "skip"]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DiagSummary:
    """A device's latest DCGM diagnostic run (``store.diagnostics.latest``)."""

    device: str
    run: str
    time: float
    status: Literal["pass", "fail", "warn", "skip"]
    """The worst of its tests' (fail, warn, pass; skip only when every test was skipped)."""
    failed: tuple[str, ...]
    """The tests that failed."""
    tests: int


@dataclass(frozen=True, kw_only=True, slots=True)
class NvmlScan:
    """What NVML said of one GPU around one of its scans (``store.hardware``): the scanner's telemetry before and
    after it (``scans.meta``). A reading the GPU or its driver did not give, or that is not a count, is None."""

    device: str
    scan: int
    time: float
    """When the scan started."""
    xids: tuple[int, ...] = ()
    """The XID events delivered while it ran, hardware or not (:mod:`sdcguard.fleet.nvml` tells which count)."""
    dbe_growth: int | None = None
    """Volatile double-bit ECC errors counted during the scan (after less before, a reset counting none)."""
    uncorrectable_rows_growth: int | None = None
    """Rows remapped for uncorrectable errors during the scan."""
    remap_failure: bool | None = None
    """A row remapping failed (either snapshot says so)."""
    remap_pending: bool | None = None
    """A remapped row waits for a GPU reset. This and the counts below: the latest snapshot's readings."""
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None


@dataclass(frozen=True, kw_only=True)
class SpoolBacklog:
    """What a spool holds that has not reached its server (:meth:`~.maintenance.Maintenance.backlog`)."""

    scans: int
    incidents: int
    oldest: float | None
    """When the oldest of them was written (None: nothing waits)."""
    last_forward: float | None
    """When the spool was last forwarded whole (None: never)."""


@dataclass(frozen=True, kw_only=True)
class PruneStats:
    """What ``prune`` rolled up and removed."""

    before: float
    """The retention horizon (UTC midnight): scans that started before it are rolled up."""
    scans: int
    results: int
    rollup_rows: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointEntry:
    """A checkpoint the training guard saved (``sdcguard.checkpoint.save`` with a guard, or an adapter)."""

    checkpoint_id: str
    step: int
    """The last optimizer step the saved state includes."""
    verified: bool
    """Every rank's checks vouched for every step up to ``step`` when it was saved."""
    digest: str
    """The checkpoint's fingerprint digest (empty when the saver had none)."""
    job: str | None
    time: float
    status: CheckpointStatus = "saved"
    """``failed``: an asynchronous save whose background write failed (never verified, never a rollback target)."""
    detail: str = ""
    """Why it failed."""


CheckpointStatus = Literal["saved", "failed"]
ScrubStatus = Literal["clean", "corrupt", "unverified", "unreadable"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ScrubEntry:
    """One checkpoint re-read at rest by ``sdcguard scrub``."""

    checkpoint_id: str
    status: ScrubStatus
    """``clean``: every tensor matched its fingerprint; ``corrupt``: a tensor, DCP's index or the record differs
    (``bad`` names them); ``unverified``: none differs, but some could not be compared (``unverified`` names them);
    ``unreadable``: it could not be checked (missing, no record, an I/O error)."""
    tensors: int
    bytes: int
    bad: tuple[str, ...]
    unverified: tuple[str, ...]
    detail: str
    host: str
    time: float


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseTiming:
    """The passing first executions of one case in one scan of one device, and the device time they took (what
    :mod:`sdcguard.fleet.slow` compares across devices of one model)."""

    device: str
    case: str
    family: str
    scan: int
    executions: int
    seconds: float
    """Summed device time of those executions (thread CPU time on a core, kernel time on a GPU)."""


@dataclass(frozen=True, slots=True)
class CaseTimes:
    """:class:`CaseTiming` records as columns (one entry per record, in the same order): what the store hands the
    slowness statistic for a whole fleet (hundreds of thousands of records) without an object per record."""

    device: Sequence[str]
    case: Sequence[str]
    family: Sequence[str]
    scan: Sequence[int]
    executions: Sequence[int]
    seconds: Sequence[float]

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[Any, ...]], *, scan: int | None = None) -> CaseTimes:
        """From ``(device, case, family, scan, executions, seconds)`` rows, or ``(device, case, family, executions,
        seconds)`` rows of one ``scan``."""
        columns = [list(map(itemgetter(k), rows)) for k in range(len(rows[0]))] if rows else [[]] * 6
        if scan is not None and rows:
            columns.insert(3, [scan] * len(rows))
        device, case, family, scans, executions, seconds = columns
        return cls(device, case, family, scans, executions, seconds)

    @classmethod
    def from_records(cls, records: Iterable[CaseTiming]) -> CaseTimes:
        return cls.from_rows([(t.device, t.case, t.family, t.scan, t.executions, t.seconds) for t in records])

    def __len__(self) -> int:
        return len(self.device)

    def __add__(self, other: CaseTimes) -> CaseTimes:
        return CaseTimes(
            tuple(self.device) + tuple(other.device),
            tuple(self.case) + tuple(other.case),
            tuple(self.family) + tuple(other.family),
            tuple(self.scan) + tuple(other.scan),
            tuple(self.executions) + tuple(other.executions),
            tuple(self.seconds) + tuple(other.seconds),
        )

    def records(self) -> Iterator[CaseTiming]:
        for d, c, f, s, n, t in zip(self.device, self.case, self.family, self.scan, self.executions, self.seconds):
            yield CaseTiming(device=d, case=c, family=f, scan=s, executions=n, seconds=t)
