"""The quarantine policy's settings (:class:`QuarantinePolicy`: frozen, keyword-only, validated once) and the two
places a run applies them (:data:`PolicyScope`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...durations import DAY_S, DEFAULT_WINDOW_S
from ..slow import SlowSettings

__all__ = ["QuarantinePolicy", "PolicyScope"]

PolicyScope = Literal["fleet", "node"]
"""``node``: the rules a node's own store can decide alone; ``fleet``: every rule (see :mod:`sdcguard.fleet.policy`)."""


@dataclass(frozen=True, kw_only=True)
class QuarantinePolicy:
    """When to quarantine a device. Defaults suit a fleet where healthy hardware never fails a golden case."""

    window_s: float = DEFAULT_WINDOW_S
    """Look-back window for rates and incidents (7 days)."""
    confidence: float = 0.95
    """Confidence of the one-sided Clopper–Pearson lower bound compared with ``rate_threshold``."""
    rate_threshold: float = 1e-4
    """Quarantine when ``rate_low`` exceeds this (one failure in 10,000 executions). The lower bound sits below
    the true rate, so the threshold must sit well below the rates worth catching; healthy devices (rare
    transients) still need two failures within ~3,500 executions to cross it (``benchmarks/fleet_policy.py``)."""
    quarantine_on_sticky: bool = True
    """Quarantine on any failure reproduced on retest (``CaseResult.sticky``)."""
    incident_threshold: int = 2
    """Quarantine a device named alone by at least this many training incidents in the window (0: off)."""
    incident_breaker_devices: int = 3
    """Training breaker: one job's incidents naming at least this many distinct devices, none of them sticky, ..."""
    incident_breaker_share: float = 0.25
    """... and at least this share of the devices the job's guard watched (``Incident.job_size``; unknown for
    incidents of older versions, which then need the count alone) leave the pattern software leaves, not faulty
    hardware: none of that job's transient incidents count. Three faulty devices in a job of 10,000 do not trip
    it."""
    breaker_window_s: float = DAY_S
    """Window of the circuit breaker (1 day), and the time bucket of its share rule."""
    breaker_same_digest_devices: int = 2
    """A wrong output (digest) shared by this many devices is weighed by the breaker (suite or shared defect)."""
    breaker_share: float = 0.25
    """Trip when more than this share of the devices that ran one case in one bucket failed it ..."""
    breaker_min_devices: int = 3
    """... and at least this many did (so one bad core of a 4-core host does not trip it)."""
    probation_clean_scans: int = 3
    """Complete scans without a failure that end a probation after a manual release."""
    reap_grace_s: float = 600.0
    """A ``running`` scan older than its budget plus this is marked ``interrupted``."""
    slow_threshold: float = 0.2
    """A device is slow when the lower confidence bound (at ``confidence``) of its time for the golden cases over
    its peers' median time exceeds ``1 + slow_threshold`` (:mod:`..slow`); a training job's ``slow`` incident says
    the same. Recorded as a decision ``slow``, shown beside the status; never evidence of corruption."""
    dcgm_failures: bool = False
    """Also quarantine a device whose latest DCGM diagnostic in the window failed a test (``sdcguard import dcgm``).
    Off by default: DCGM's failures include what the golden suite does not judge (PCIe bandwidth, power, thermal
    limits, a process on the GPU), and no retest reproduces them here; the report shows them beside each device, and
    a fleet that trusts its diagnostic level turns this on."""
    nvml_errors: bool = False
    """Also quarantine a GPU whose scans in the window saw a hardware event in NVML's telemetry: an XID of
    :data:`~..nvml.HARDWARE_XIDS`, a double-bit ECC count or uncorrectable remapped rows that grew, a failed row
    remapping (``store.hardware``). Off by default: an XID or an ECC error can be the driver's or the application's
    doing rather than the GPU's, a GPU reset clears some, and a fleet that already acts on DCGM's or NVSentinel's
    health events would take the same GPU out twice; the report shows them beside each GPU."""
    slow_drain: bool = False
    """Also quarantine a slow device (the actions drain it). Off: a slow device computes right answers; the
    report, the HTML page and Prometheus show it, and the decision is recorded."""

    @property
    def slow_settings(self) -> SlowSettings:
        """The slowness rule's settings this policy implies (its threshold, at its confidence)."""
        return SlowSettings(threshold=self.slow_threshold, confidence=self.confidence)

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.breaker_window_s <= 0:
            raise ValueError("windows must be > 0 seconds")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if not 0 <= self.rate_threshold < 1:
            raise ValueError(f"rate_threshold must be in [0, 1), got {self.rate_threshold}")
        if not 0 < self.breaker_share <= 1 or not 0 < self.incident_breaker_share <= 1:
            raise ValueError("breaker_share and incident_breaker_share must be in (0, 1]")
        if self.breaker_same_digest_devices < 2:
            raise ValueError("breaker_same_digest_devices must be >= 2")
        if self.incident_breaker_devices < 2:
            raise ValueError("incident_breaker_devices must be >= 2")
        if not 0 < self.slow_threshold < 10:
            raise ValueError(f"slow_threshold must be in (0, 10), got {self.slow_threshold}")
        if self.incident_threshold < 0 or self.probation_clean_scans < 0 or self.breaker_min_devices < 1:
            raise ValueError("incident_threshold, probation_clean_scans must be >= 0, breaker_min_devices >= 1")
