"""Sections ``scan`` and ``drill``: the fleet scanner end to end, through its command line only.

``scan``: ``sdcguard --db <fresh> scan --device cuda:0 --budget 30 --json``: every execution passes, the scan
completes with a telemetry snapshot, then ``sdcguard report --format json`` shows the GPU healthy with exactly the
executions the scan ran, and nothing is quarantined.

``drill``: ``sdcguard --db <fresh> scan --device cuda:0 --budget 15 --retests 1 --inject cuda:0:bitflip
--drill-store <fresh>``: the scan exits 1, the failure reproduces on retest (sticky), the policy quarantines the GPU
in the drill store, and ``sdcguard quarantine list`` and ``report`` on it say so.

Each store is fresh (a temporary folder), so what they hold comes from this run alone. The functions take the
device spec, so the tests drive the same code with ``cpu:0``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from .context import Context, run_command
from .results import SectionReport

__all__ = ["run_scan", "run_drill", "scan_checks", "drill_checks", "SCAN_BUDGET_S", "DRILL_BUDGET_S", "GPU_TELEMETRY"]

SCAN_BUDGET_S = 30.0
DRILL_BUDGET_S = 15.0
GPU_TELEMETRY = ("temperature_c", "sm_clock_mhz", "mem_clock_mhz", "power_w")
"""Readings every NVIDIA GPU's snapshot holds (the ECC, remapped-rows and XID fields: the ``nvml`` section)."""


def _sdcguard(db: Path, *args: str, timeout: float) -> tuple[int, str, str]:
    return run_command(["-m", "sdcguard", "--db", str(db), *args], timeout=timeout)


def _events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a stray line from a library: not an event
        if isinstance(event, dict):
            out.append(event)
    return out


def _first(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next((e for e in events if e.get("event") == kind), {})


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def scan_checks(
    rep: SectionReport,
    spec: str,
    db: Path,
    *,
    budget: float,
    timeout: float,
    telemetry: tuple[str, ...],
    only_idle: bool = True,
) -> dict[str, Any]:
    """A clean scan of ``spec`` into the fresh store ``db``, then the report (checks on ``rep``). ``only_idle``
    False passes ``--all`` (the tests' CPU core is shared with whatever else runs)."""
    rc, out, err = _sdcguard(
        db,
        "scan",
        "--device",
        spec,
        "--budget",
        f"{budget:g}",
        "--json",
        *(() if only_idle else ("--all",)),
        timeout=timeout,
    )
    events = _events(out)
    done, summary = _first(events, "done"), _first(events, "summary")
    last_err = err.strip().splitlines()[-1] if err.strip() else ""
    rep.check("sdcguard scan exits 0", rc == 0, summary.get("message") or last_err or f"exit {rc}")
    rep.check(
        "the scan completed its budget with every execution passing",
        done.get("status") == "complete" and done.get("executions", 0) > 0 and done.get("failures") == 0,
        f"status {done.get('status')}"
        + (f" ({done['reason']})" if done.get("reason") else "")
        + f", {done.get('executions')} executions, {done.get('failures')} failures in {done.get('elapsed_s')} s",
    )
    snap = done.get("telemetry_after") or {}
    missing = [k for k in telemetry if k not in snap]
    rep.check(
        "the scan took a telemetry snapshot",
        bool(snap) and not missing,
        f"missing {missing}" if missing else ", ".join(f"{k}={v}" for k, v in snap.items() if k != "time"),
    )
    device = str(done.get("device", ""))
    rc, out, err = _sdcguard(db, "report", "--format", "json", timeout=30)
    rows = {r["device"]: r for r in _json(out) or [] if isinstance(r, dict)}
    row = rows.get(device, {})
    rep.check(
        "sdcguard report shows the device healthy with the scan's executions",
        rc == 0
        and row.get("status") == "healthy"
        and row.get("executions") == done.get("executions")
        and row.get("failures") == 0,
        f"{device}: status {row.get('status')}, {row.get('executions')} executions"
        if row
        else f"exit {rc}, devices {sorted(rows)}",
    )
    rc, out, _ = _sdcguard(db, "quarantine", "list", "--format", "json", timeout=30)
    rep.check("nothing is quarantined", rc == 0 and _json(out) == [], out.strip()[:200])
    return {
        "device": device,
        "executions": done.get("executions"),
        "elapsed_s": done.get("elapsed_s"),
        "executions_per_s": (done.get("executions") or 0) / max(1e-9, float(done.get("elapsed_s") or 0)),
        "telemetry_after": snap,
        "report": row,
    }


def drill_checks(
    rep: SectionReport, spec: str, db: Path, *, budget: float, timeout: float, only_idle: bool = True
) -> dict[str, Any]:
    """A fire drill on ``spec`` into the fresh store ``db``: found, sticky, quarantined (checks on ``rep``)."""
    inject = f"{spec}:bitflip"
    rc, out, err = _sdcguard(
        db,
        "scan",
        "--device",
        spec,
        "--budget",
        f"{budget:g}",
        "--retests",
        "1",
        "--inject",
        inject,
        "--drill-store",  # a drill is recorded in a drill store (never the fleet's): this fresh one, read below
        str(db),
        "--json",
        *(() if only_idle else ("--all",)),
        timeout=timeout,
    )
    events = _events(out)
    done, policy = _first(events, "done"), _first(events, "policy")
    device = str(done.get("device", ""))
    rep.check(
        "sdcguard scan --inject exits 1 (corruption found)",
        rc == 1,
        f"exit {rc}" + (f": {err.strip().splitlines()[-1]}" if err.strip() else ""),
    )
    rep.check(
        "the injected failure reproduced on retest (sticky)",
        bool(done.get("sticky_cases")),
        f"{done.get('failures')} failing executions, sticky: {done.get('sticky_cases')}",
    )
    rep.check(
        "the policy quarantined the device",
        device in (policy.get("quarantined") or []),
        "; ".join(policy.get("reasons") or []) or str(policy),
    )
    rc, out, _ = _sdcguard(db, "quarantine", "list", "--format", "json", timeout=30)
    listed = {r.get("device"): r.get("state") for r in _json(out) or [] if isinstance(r, dict)}
    rep.check("sdcguard quarantine list names it", listed.get(device) == "quarantined", str(listed))
    rc, out, _ = _sdcguard(db, "report", "--format", "json", timeout=30)
    row = next((r for r in _json(out) or [] if isinstance(r, dict) and r.get("device") == device), {})
    rep.check("sdcguard report shows it quarantined", row.get("status") == "quarantined", str(row.get("status")))
    return {
        "device": device,
        "inject": inject,
        "executions": done.get("executions"),
        "failures": done.get("failures"),
        "retest_runs": done.get("retest_runs"),
        "reasons": policy.get("reasons"),
    }


def _preflight(rep: SectionReport) -> None:
    import sqlite3

    # the store's writes are upserts (INSERT ... ON CONFLICT DO UPDATE): SQLite 3.24 or newer
    rep.check(
        "the fleet store's SQLite (the standard library's sqlite3) has upserts",
        sqlite3.sqlite_version_info >= (3, 24, 0),
        f"SQLite {sqlite3.sqlite_version}",
    )
    rc, out, err = run_command(["-m", "sdcguard", "scan", "--help"], timeout=30)
    rep.check("sdcguard scan --help works", rc == 0 and "--inject" in out, err.strip()[-200:])


def run_scan(ctx: Context, rep: SectionReport) -> str:
    _preflight(rep)
    spec = f"cuda:{ctx.device}"
    ctx.require_gpu(f"sdcguard scan --device {spec} --budget {SCAN_BUDGET_S:g} into a fresh store, then report")
    with tempfile.TemporaryDirectory(prefix="gpu-check-scan-") as tmp:
        m = rep.measure(
            "scan",
            scan_checks(
                rep, spec, Path(tmp) / "sdcguard.db", budget=SCAN_BUDGET_S, timeout=ctx.left(), telemetry=GPU_TELEMETRY
            ),
        )
    return f"{m['executions']} executions on {m['device']} in {m['elapsed_s']} s, all passed; report healthy"


def run_drill(ctx: Context, rep: SectionReport) -> str:
    from sdcguard.inject import parse_inject_spec

    spec = f"cuda:{ctx.device}"
    rep.check("the drill's --inject spec parses", len(parse_inject_spec(f"{spec}:bitflip")) == 1)
    _preflight(rep)
    ctx.require_gpu(
        f"sdcguard scan --device {spec} --inject {spec}:bitflip into a fresh store and see the GPU quarantined"
    )
    with tempfile.TemporaryDirectory(prefix="gpu-check-drill-") as tmp:
        m = rep.measure(
            "drill", drill_checks(rep, spec, Path(tmp) / "sdcguard.db", budget=DRILL_BUDGET_S, timeout=ctx.left())
        )
    return f"{m['device']} quarantined after {m['failures']} failing executions ({'; '.join(m['reasons'] or [])})"
