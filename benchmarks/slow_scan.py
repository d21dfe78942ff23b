"""Slow devices on the scanner: false flags on clean scans of a loaded machine, and the drill's detection.

Runs ``sdcguard scan --all`` on this machine's CPU cores for ``--budget`` seconds, each time into a fresh store
(one budgeted scan of both cores: the least evidence a verdict can have), ``--repeats`` times clean and
``--drills`` times with ``--inject cpu:<last core>:slow,factor=F``, and prints per run each core's slowdown
(its thread CPU time for the golden cases over its peer's, median over cases), its lower 95% bound and the
verdict; then how many clean runs flagged a core and how many drills flagged the slowed core (and only it). The
load average is printed with each run: run it while the machine is busy.

    python benchmarks/slow_scan.py [--repeats 20] [--drills 5] [--budget 2] [--factor 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(db: Path, budget: float, *extra: str) -> tuple[dict[str, dict[str, object]], str]:
    """The report's rows after one scan, and what the scan said when it did not exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "sdcguard", "--db", str(db)]
    drill = ("--drill-store", str(db)) if "--inject" in extra else ()  # a drill's own store, read as any store
    scan = subprocess.run(
        [
            *base,
            "scan",
            "--all",
            "--json",
            "--budget",
            str(budget),
            "--lock-dir",
            str(db.parent / "locks"),
            *extra,
            *drill,
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    out = subprocess.run([*base, "report", "--format", "json"], check=True, capture_output=True, text=True, env=env)
    why = "" if scan.returncode == 0 else f"  [scan exit {scan.returncode}: {scan.stderr.strip()[-200:]}]"
    return {r["device"]: r for r in json.loads(out.stdout)}, why


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--drills", type=int, default=5)
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--factor", type=float, default=2.0)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    slowed = cores[-1]
    false_flags = found = 0
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("clean", ())] * args.repeats + [
            ("drill", ("--inject", f"cpu:{slowed}:slow,factor={args.factor}"))
        ] * args.drills
        for n, (kind, extra) in enumerate(runs):
            rows, why = _run(Path(tmp) / f"{n}.db", args.budget, *extra)
            flagged = sorted(d for d, r in rows.items() if r["slow"])
            load = os.getloadavg()[0]
            figures = ", ".join(
                f"{d} {r['slowdown']}x (low {r['slowdown_low']}){' SLOW' if r['slow'] else ''}"
                + (
                    ""
                    if r["slowdown"] is not None
                    else f" [{r['slow_basis']}, {r['executions']} executions, {r['scans']} scans]"
                )
                for d, r in sorted(rows.items())
            )
            print(f"{kind} {n:2d}  load {load:5.2f}  {figures}{why}", flush=True)
            if kind == "clean":
                false_flags += bool(flagged)
            else:
                found += flagged == [d for d in rows if d.endswith(f":{slowed}")]
    print(
        f"clean scans that flagged a core: {false_flags}/{args.repeats}; drills (factor {args.factor}) that "
        f"flagged the slowed core alone: {found}/{args.drills}; budget {args.budget} s per core, {len(cores)} cores"
    )


if __name__ == "__main__":
    main()
