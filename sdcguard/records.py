"""The records that cross module boundaries: what a golden case run produced, what the training guard found,
and what is known about a device. One definition each; the store persists exactly these fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DeviceInfo", "CaseResult", "Incident", "ScanStatus", "SLOW_KIND", "PASSIVE_KINDS", "NOT_EVIDENCE_KINDS"]

ScanStatus = Literal["running", "complete", "preempted", "interrupted", "error"]
"""``running`` until the scanner finishes it; a scan left ``running`` by a killed process is never counted as
complete. ``preempted``: a job appeared on the device; ``error``: the suite could not run (never a device fault)."""


SLOW_KIND = "slow"
"""The kind of a training incident naming a rank that computes the same work consistently slower than its peer."""
PASSIVE_KINDS = frozenset({"nondeterministic", SLOW_KIND})
"""Incident kinds that never accuse a device of corruption: never a veto, an escalation, a raise or an exit, never
evidence for quarantine or the training breaker, never ``suspect`` in the report."""
NOT_EVIDENCE_KINDS = PASSIVE_KINDS | {"nonfinite", "reduction"}
"""Incident kinds the fleet's quarantine rule never counts against the device they name: the passive ones,
``nonfinite`` (a step vetoed for a NaN or an infinity, whose causes are many, a rank's own batch among them; the
replay, checksum and memory verdicts of the same step judge the hardware) and ``reduction`` (a gradient changed
between the rank's backward and DDP's all-reduce, most often by a gradient hook registered after the guard's: software
as often as a device)."""


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """What the fleet knows about one device (one row of the ``devices`` table)."""

    id: str
    """``GPU-<uuid>``, ``cpu:<host>:<core>`` or ``sim:<n>`` (see :mod:`sdcguard.devices`)."""
    host: str
    kind: Literal["gpu", "cpu", "sim"]
    model: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    index: int | None = None
    """Local index on its host: the NVML/CUDA index of a GPU, the core of a CPU (the Prometheus ``gpu`` label)."""


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """One execution of one golden case on one device, compared bit-exactly with the golden output."""

    device: str
    case: str
    """Case id from the golden manifest, e.g. ``gemm.fp32.n256``."""
    family: str
    """Kernel family: ``gemm``, ``alu``, ``ieee``, ``intrinsics``, ``memory``, ``shared`` (or ``sim``)."""
    seed: int
    """Seed of the case's input generator: the failure replays on any other device."""
    passed: bool
    """False when the output differs from the golden in at least one bit."""
    duration_s: float
    started_at: float = field(default_factory=time.time)
    """Unix time the execution started."""
    output_digest: str | None = None
    """sha256 (hex) of the raw output bytes; the circuit breaker compares wrong outputs across devices."""
    mismatches: int = 0
    """Number of output elements that differ from the golden."""
    element: int | None = None
    """Flat index of the first differing element."""
    expected: str | None = None
    """Raw bits of the expected element, hex (``0x3f800000``)."""
    actual: str | None = None
    """Raw bits of the actual element, hex."""
    xor_mask: str | None = None
    """``expected ^ actual``, hex: which bits flipped."""
    location: str | None = None
    """Where it ran or failed: ``sm:12``, ``core:3``, ``addr:0x7f..`` (memory families)."""
    attempt: int = 0
    """0 for the first run, 1..N for retests of a failure."""
    sticky: bool | None = None
    """After retests: True if the failure reproduced, False if it did not, None when not retested."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Free-form extra facts (bytes tested, second read of a memory word, telemetry...)."""
    executions: int = 1
    """How many passing executions of this case this record stands for: 1 for one execution (what a backend
    returns); the store keeps one row per (scan, case) for the passing first attempts, with their count, summed
    ``duration_s``, first ``started_at`` and ``last_started_at``. A failed execution or a retest is always one."""
    last_started_at: float | None = None
    """When the last of ``executions`` started (None: the same as ``started_at``)."""

    def __post_init__(self) -> None:
        if self.executions < 1 or ((not self.passed or self.attempt) and self.executions != 1):
            raise ValueError(
                f"executions must be >= 1, and 1 for a failed execution or a retest; got {self.executions}"
            )


@dataclass(frozen=True, kw_only=True)
class Incident:
    """A corrupted training step found by the guard."""

    kind: str
    """Which check fired: ``replay`` (a device named by the rule of evidence), ``calibration`` (the same, found by
    ``guard.calibrate``), ``unresolved`` (two or more devices disagree and nothing decides: all are suspects),
    ``gradient_replica``, ``weight_replica``, ``checksum`` (a matmul's result failed its checksum on the suspect's own
    device: local, no vote), ``memory`` (the suspect's own parameter shards changed outside the optimizer step: local,
    no vote), ``nonfinite`` (a non-finite loss or gradient), ``nondeterministic`` (the setup, never a device),
    ``slow`` (a rank consistently slower on the same work: never corruption, see :data:`PASSIVE_KINDS`)."""
    step: int
    suspect_ranks: tuple[int, ...]
    device: str | None
    """Device id of the (first) suspect, or None when no single device could be named."""
    detail: str
    """One human sentence: what differed, where, and how it was settled."""
    devices: tuple[str, ...] = ()
    """Device ids of every suspect rank, in the order of ``suspect_ranks``."""
    hosts: tuple[str, ...] = ()
    """Hostnames of every suspect rank, in the order of ``suspect_ranks``."""
    parameter: str | None = None
    """First differing parameter (or bucket) name; for a ``checksum`` incident the layer (forward) or autograd node
    (backward) of the failed matmul, with its op and pass, e.g. ``blocks.0.fc1 [aten.addmm, forward]``."""
    sticky: bool | None = None
    """True when a re-run on the suspect device reproduced the wrong result."""
    job: str | None = None
    """The training job's id: the launcher's (torchelastic, Slurm) or one the guard made for the job."""
    time: float = field(default_factory=time.time)
    rollback: str | None = None
    """Where to restart from: the id of the newest verified checkpoint older than the earliest step the fault could
    have touched (None: no such checkpoint is known)."""
    job_size: int | None = None
    """How many devices the job's guard watched (the training breaker weighs the devices a job named against it)."""
    recovered_step: int | None = None
    """Under ``escalate="recover"``: the step the job went on from after the recovery (its last verified snapshot);
    None when it did not recover."""
    steps_lost: int | None = None
    """Under ``escalate="recover"``: steps computed again (from the recovered step to the verdict's step)."""
    recovery_s: float | None = None
    """Under ``escalate="recover"``: seconds from the verdict to the start of the next step."""
    replacement_device: str | None = None
    """Under ``escalate="recover"``: the device id of the spare that took the leaver's place (None: none did)."""
    first_step: int | None = None
    """The earliest step the fault could have touched (the step after the suspect's last clean sample): a sticky
    fault seen at ``step`` may have been in every step from here on. None when only ``step`` could be."""
    rollback_step: int | None = None
    """The newest verified state from before the fault, named by the step it starts: what a recovery rolls back to
    and a restart should load (``rollback`` names a checkpoint of it or of an older state when one is known). None
    when no state is verified yet."""

    def steps(self) -> str:
        """The steps the fault may have touched: ``3-4``, or ``4`` when only the step it was seen at."""
        first = self.first_step
        return f"{first}-{self.step}" if first is not None and first < self.step else str(self.step)

    def roll_back_to(self) -> str:
        """Where to roll back to, for a table: the checkpoint, else the verified state, else ``-``."""
        if self.rollback:
            return self.rollback
        return f"state before step {self.rollback_step}" if self.rollback_step is not None else "-"
