"""What crosses into a device's processes on stdin, and what a retest sends back: one frozen dataclass each.

The runner starts ``python -m fleet_scan.device_scan.worker`` with a :class:`WorkerRequest`; a worker starts
``python -m fleet_scan.device_scan.retest`` with a :class:`RetestRequest` and reads back its results
(:func:`results_to_json`, :func:`results_from_json`). Each is written as one JSON object; the options carry the fire
drill already parsed (:class:`~fleet_scan.options.ScanOptions`), so neither process parses anything the parent gave.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sdcguard.records import CaseResult

from ..devices.discovery import ScanTarget
from ..options import ScanOptions

__all__ = ["WorkerRequest", "RetestRequest", "results_to_json", "results_from_json"]


@dataclass(frozen=True, kw_only=True)
class WorkerRequest:
    """One device's scan, as the runner hands it to the worker process."""

    target: ScanTarget
    options: ScanOptions
    references: str | None = None
    """The directory of inputs and expected outputs the parent built off this device (None: a worker started by
    hand loads and checks the golden data itself)."""

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target.to_json(), "options": self.options.to_json(), "references": self.references}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerRequest:
        return cls(
            target=ScanTarget.from_json(data["target"]),
            options=ScanOptions.from_json(data["options"]),
            references=data.get("references"),
        )


@dataclass(frozen=True, kw_only=True)
class RetestRequest:
    """Re-run one failing case ``n`` times on the worker's device, in a fresh process."""

    target: ScanTarget
    options: ScanOptions
    case: str
    """The case id."""
    n: int
    """How many runs (``attempt`` 1..n)."""
    references: str | None = None
    """The worker's references directory (:attr:`WorkerRequest.references`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.to_json(),
            "options": self.options.to_json(),
            "case": self.case,
            "n": self.n,
            "references": self.references,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetestRequest:
        return cls(
            target=ScanTarget.from_json(data["target"]),
            options=ScanOptions.from_json(data["options"]),
            case=str(data["case"]),
            n=int(data["n"]),
            references=data.get("references"),
        )


def results_to_json(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """A retest's answer: every result with every field."""
    return [dataclasses.asdict(r) for r in results]


def results_from_json(data: list[dict[str, Any]]) -> list[CaseResult]:
    """The results :func:`results_to_json` wrote (``TypeError`` or ``ValueError`` for anything else)."""
    if not isinstance(data, list):
        raise TypeError(f"expected a list of results, got {type(data).__name__}")
    return [CaseResult(**d) for d in data]
