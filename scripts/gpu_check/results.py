"""Outcomes of sections and the one results file a run writes (``<out>/results.json``).

The file is rewritten whole (write, then rename) after every section, so a run killed at any point still leaves
valid JSON with every section finished so far. Its shape, for ``benchmarks/`` and the docs to quote::

    {"format": "sdcguard-gpu-check/1",
     "run": {"started": ..., "dry_run": ..., "host": ..., "python": ..., "torch": ..., "gpus": [...], ...},
     "sections": [{"section": "fingerprint", "status": "PASS", "reason": "...", "seconds": 12.3,
                   "timeout_s": 60, "checks": [{"name": ..., "ok": true, "detail": ...}],
                   "measurements": {...}}, ...],
     "summary": {"PASS": 7, "FAIL": 0, "SKIP": 1, "seconds": 211.4}}
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Status",
    "STATUSES",
    "FORMAT",
    "RESULTS",
    "LOG",
    "Check",
    "Outcome",
    "SectionReport",
    "begin",
    "load",
    "record",
    "summary_line",
    "verdict_line",
]

Status = Literal["PASS", "FAIL", "SKIP"]
STATUSES: tuple[Status, ...] = ("PASS", "FAIL", "SKIP")
FORMAT = "sdcguard-gpu-check/1"
RESULTS = "results.json"
LOG = "gpu_check.log"


@dataclass(frozen=True, kw_only=True)
class Check:
    """One assertion a section made."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(kw_only=True)
class Outcome:
    """How one section ended."""

    section: str
    status: Status
    reason: str
    seconds: float = 0.0
    timeout_s: float | None = None
    checks: list[Check] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        checks = [Check(**c) for c in data.get("checks", [])]
        return cls(
            section=data["section"],
            status=data["status"],
            reason=data["reason"],
            seconds=float(data.get("seconds", 0.0)),
            timeout_s=data.get("timeout_s"),
            checks=checks,
            measurements=dict(data.get("measurements", {})),
        )


class SectionReport:
    """What a section fills in as it goes: checks (printed as they happen) and measurements."""

    def __init__(self, section: str, *, stream: Any = None) -> None:
        self.section = section
        self.checks: list[Check] = []
        self.measurements: dict[str, Any] = {}
        self._stream = stream

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record (and print) one assertion; returns ``ok`` so a section can stop early on a failed one."""
        self.checks.append(Check(name=name, ok=bool(ok), detail=detail))
        self.say(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return bool(ok)

    def measure(self, key: str, value: Any) -> Any:
        """Record a measurement (JSON-able) under ``key``; returns it."""
        self.measurements[key] = value
        return value

    def say(self, text: str) -> None:
        print(text, file=self._stream or sys.stdout, flush=True)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def outcome(
        self,
        *,
        seconds: float,
        timeout_s: float | None,
        skip: str | None = None,
        error: str | None = None,
        passed: str | None = None,
    ) -> Outcome:
        """The section's outcome: FAIL on an error or any failed check, else SKIP when asked to, else PASS."""
        if error is not None:
            status: Status = "FAIL"
            reason = error
        elif self.failed:
            status = "FAIL"
            reason = "; ".join(f"{c.name}" + (f" ({c.detail})" if c.detail else "") for c in self.failed[:3])
            if len(self.failed) > 3:
                reason += f"; and {len(self.failed) - 3} more failed checks"
        elif skip is not None:
            status, reason = "SKIP", skip
        elif not self.checks:
            status, reason = "FAIL", "the section made no check"
        else:
            status = "PASS"
            reason = passed or f"{len(self.checks)} checks passed"
        return Outcome(
            section=self.section,
            status=status,
            reason=reason,
            seconds=round(seconds, 2),
            timeout_s=timeout_s,
            checks=list(self.checks),
            measurements=dict(self.measurements),
        )


def _write(out: Path, body: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{RESULTS}.tmp"
    tmp.write_text(json.dumps(body, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(tmp, out / RESULTS)


def load(out: Path) -> dict[str, Any]:
    """The results file of ``out`` (a fresh skeleton where there is none yet)."""
    path = Path(out) / RESULTS
    if not path.is_file():
        return {"format": FORMAT, "run": {}, "sections": [], "summary": {}}
    body = json.loads(path.read_text())
    if body.get("format") != FORMAT:
        raise ValueError(f"{path} is not a GPU check results file (format {FORMAT!r})")
    return dict(body)


def begin(out: Path, run: dict[str, Any]) -> None:
    """Start a results file for a new run (replacing an older one in ``out``)."""
    _write(Path(out), {"format": FORMAT, "run": run, "sections": [], "summary": {}})


def record(out: Path, outcome: Outcome) -> None:
    """Add (or replace) one section's outcome and refresh the summary counts."""
    body = load(out)
    sections = [s for s in body["sections"] if s["section"] != outcome.section] + [outcome.to_json()]
    body["sections"] = sections
    counts = {s: sum(1 for x in sections if x["status"] == s) for s in STATUSES}
    body["summary"] = {**counts, "seconds": round(sum(float(x.get("seconds", 0)) for x in sections), 2)}
    _write(Path(out), body)


def verdict_line(outcome: Outcome) -> str:
    """The line that ends a section: ``[name] STATUS (seconds): reason``."""
    return f"[{outcome.section}] {outcome.status} ({outcome.seconds:.1f} s): {outcome.reason}"


def summary_line(body: dict[str, Any], *, dry_run: bool) -> str:
    """``gpu_check: 7 PASS, 0 FAIL, 1 SKIP in 211.4 s (dry run)``."""
    s = body.get("summary", {})
    text = ", ".join(f"{s.get(k, 0)} {k}" for k in STATUSES)
    return f"gpu_check: {text} in {float(s.get('seconds', 0.0)):.1f} s" + (" (dry run)" if dry_run else "")
