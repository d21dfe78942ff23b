"""What one device's scan ends with: its summary, the worker's ``done`` event.

A worker process (:mod:`fleet_scan.device_scan.worker`) ends by writing its :class:`DeviceSummary` as one JSON line; the
runner (:mod:`fleet_scan.runner`) reads it back with :meth:`DeviceSummary.from_json` and decides the exit code from the
summaries of every device. The JSON form is also what ``sdcguard scan --json`` prints for the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sdcguard.records import ScanStatus

__all__ = ["DeviceSummary", "SummaryStatus", "SKIPPED"]

SummaryStatus = ScanStatus | Literal["locked", "busy"]
"""A recorded scan's status, or why the device was not scanned: ``locked`` (another scanner holds it), ``busy``
(other work runs on it), or ``error`` without a scan (the worker could not start one)."""
SKIPPED: tuple[SummaryStatus, ...] = ("busy", "locked")
"""The statuses of a device left alone: nothing was recorded for it."""


@dataclass(frozen=True, kw_only=True)
class DeviceSummary:
    """One device's outcome. The fields after ``scan`` describe the scan recorded as ``scan`` (None: none was)."""

    EVENT: ClassVar[str] = "done"
    """Its kind of event (:mod:`fleet_scan.events`)."""
    device: str
    status: SummaryStatus
    kind: str | None = None
    """``gpu`` or ``cpu``; None for a worker that failed before it knew (or died)."""
    reason: str | None = None
    """Why it was skipped, preempted or interrupted."""
    idle_error: str | None = None
    """The measurement that failed when the device counts as busy because it could not be measured."""
    error: str | None = None
    """What went wrong (status ``error``): never a device fault."""
    error_type: str | None = None
    """The error's class, for an error before a scan began."""
    scan: int | None = None
    """The store's id of the scan recorded (None: none was)."""
    executions: int = 0
    """First-attempt executions (what the rates count)."""
    failures: int = 0
    retest_runs: int = 0
    failing_cases: dict[str, int] = field(default_factory=dict)
    """Failed executions per case."""
    sticky_cases: tuple[str, ...] = ()
    """Cases whose failure a retest reproduced."""
    elapsed_s: float | None = None
    budget_s: float | None = None
    telemetry_after: dict[str, Any] | None = None

    @property
    def scanned(self) -> bool:
        """Whether a scan was recorded (its results are in the store, whatever its status)."""
        return self.scan is not None

    def to_json(self) -> dict[str, Any]:
        """The ``done`` event: every field of a recorded scan; a skipped device's reason (and idle error); an error's
        message (and class, when known)."""
        out: dict[str, Any] = {"event": self.EVENT, "device": self.device}
        if self.kind is not None:
            out["kind"] = self.kind
        out["status"] = self.status
        if self.scan is not None:
            out.update(
                scan=self.scan,
                executions=self.executions,
                failures=self.failures,
                retest_runs=self.retest_runs,
                failing_cases=dict(self.failing_cases),
                sticky_cases=list(self.sticky_cases),
                elapsed_s=self.elapsed_s,
                budget_s=self.budget_s,
                reason=self.reason,
                idle_error=self.idle_error,
                error=self.error,
                telemetry_after=self.telemetry_after,
            )
        elif self.status == "locked":
            out["reason"] = self.reason
        elif self.status == "busy":
            out.update(reason=self.reason, idle_error=self.idle_error)
        else:
            out.update({k: v for k, v in (("error", self.error), ("error_type", self.error_type)) if v is not None})
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceSummary:
        """The summary of a ``done`` event (:meth:`to_json`)."""
        fields = {k: v for k, v in data.items() if k != "event"}
        if "sticky_cases" in fields:
            fields["sticky_cases"] = tuple(fields["sticky_cases"])
        return cls(**fields)
