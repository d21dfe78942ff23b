"""What a scan reports as it goes: one frozen dataclass per event kind, on a worker's stdout and in ``--json``.

A worker (:mod:`fleet_scan.device_scan.worker`) writes :class:`ScanStarted`, :class:`ScanProgress`, one
:class:`CaseFailed` per failing case when its scan ends, and last its
:class:`~fleet_scan.device_scan.summary.DeviceSummary` (the ``done`` event), each as one JSON line; the runner
(:mod:`fleet_scan.runner`) reads each line back with :func:`event_from_json` and adds its own :class:`Message`,
:class:`PolicyApplied` and :class:`ScanSummary`. The reporters (:mod:`fleet_scan.progress`) read the events' fields by
name; ``sdcguard scan --json`` prints each event's ``to_json()``: one object per line, its kind under ``event``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from sdcguard.records import CaseResult

from .device_scan.summary import DeviceSummary

__all__ = [
    "Event",
    "ScanStarted",
    "ScanProgress",
    "CaseFailed",
    "Message",
    "PolicyApplied",
    "ScanSummary",
    "event_from_json",
]


def _plain(event: Any) -> dict[str, Any]:
    """``{"event": kind, field: value...}``, tuples as lists (what ``json`` writes for them anyway)."""
    out: dict[str, Any] = {"event": event.EVENT}
    for f in fields(event):
        value = getattr(event, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _values(cls: type, data: Mapping[str, Any], *tuples: str) -> dict[str, Any]:
    """The fields of ``cls`` in ``data`` (``TypeError`` for a missing or unknown one), ``tuples`` as tuples."""
    names = {f.name for f in fields(cls)}
    given = {k: v for k, v in data.items() if k != "event"}
    if set(given) != names:
        raise TypeError(f"{cls.__name__}: expected fields {sorted(names)}, got {sorted(given)}")
    return {k: tuple(v) if k in tuples else v for k, v in given.items()}


@dataclass(frozen=True, kw_only=True)
class ScanStarted:
    """A device's scan began (recorded as ``scan``)."""

    EVENT: ClassVar[str] = "start"
    device: str
    scan: int
    budget_s: float | None

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScanStarted:
        return cls(**_values(cls, data))


@dataclass(frozen=True, kw_only=True)
class ScanProgress:
    """Live counts of a device's scan (about twice a second)."""

    EVENT: ClassVar[str] = "progress"
    device: str
    elapsed_s: float
    executions: int
    """First attempts so far."""
    failures: int

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScanProgress:
        return cls(**_values(cls, data))


@dataclass(frozen=True, kw_only=True)
class CaseFailed:
    """One failing case of a device's scan, sent when the scan ends: how often it failed, and its first failure."""

    EVENT: ClassVar[str] = "failure"
    device: str
    case: str
    count: int
    """Failed executions of the case in the scan."""
    seed: int
    element: int | None
    mismatches: int
    expected: str | None
    actual: str | None
    xor_mask: str | None
    location: str | None
    sticky: bool | None
    """Whether a retest reproduced it (None: not retested)."""

    @classmethod
    def first(cls, device: str, result: CaseResult, count: int) -> CaseFailed:
        """The event of a case whose first failed execution is ``result``."""
        return cls(
            device=device,
            case=result.case,
            count=count,
            seed=result.seed,
            element=result.element,
            mismatches=result.mismatches,
            expected=result.expected,
            actual=result.actual,
            xor_mask=result.xor_mask,
            location=result.location,
            sticky=result.sticky,
        )

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CaseFailed:
        return cls(**_values(cls, data))


@dataclass(frozen=True, kw_only=True)
class Message:
    """A line for the operator (the runner's notes, such as where the references were built)."""

    EVENT: ClassVar[str] = "message"
    text: str

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        return cls(**_values(cls, data))


@dataclass(frozen=True, kw_only=True)
class PolicyApplied:
    """What the quarantine policy did after the scan."""

    EVENT: ClassVar[str] = "policy"
    scope: str
    """``fleet`` or ``node`` (:data:`sdcguard.fleet.policy.PolicyScope`)."""
    quarantined: tuple[str, ...]
    breaker_tripped: bool
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PolicyApplied:
        return cls(**_values(cls, data, "quarantined", "reasons"))


@dataclass(frozen=True, kw_only=True)
class ScanSummary:
    """The scan of the whole machine: its exit code and its one line, the last event."""

    EVENT: ClassVar[str] = "summary"
    exit_code: int
    message: str
    scanned: tuple[str, ...]
    skipped: tuple[str, ...]
    quarantined: tuple[str, ...]
    breaker_tripped: bool
    stopped_by: str | None
    """The signal's name (``SIGTERM``) when one stopped the scan."""

    def to_json(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScanSummary:
        return cls(**_values(cls, data, "scanned", "skipped", "quarantined"))


Event = ScanStarted | ScanProgress | CaseFailed | DeviceSummary | Message | PolicyApplied | ScanSummary
"""Every event of a scan."""

_KINDS: dict[str, Any] = {
    c.EVENT: c for c in (ScanStarted, ScanProgress, CaseFailed, DeviceSummary, Message, PolicyApplied, ScanSummary)
}


def event_from_json(data: Mapping[str, Any]) -> Event:
    """The event a ``to_json()`` wrote; ``ValueError`` for an object that is no event, ``TypeError`` for an event
    whose fields are not its kind's."""
    kind = data.get("event") if isinstance(data, Mapping) else None
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"not a scan event: {data!r:.80}")
    event: Event = cls.from_json(dict(data))
    return event
