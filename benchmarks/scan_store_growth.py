"""What one real scan adds to the fleet store, and a fire drill at an intermittent 5% rate.

Runs ``sdcguard scan --all`` on this machine's CPU cores for ``--budget`` seconds (8) into a fresh store and
prints the store's growth (its size after the scan less the size of an empty store), the rows and the executions
they hold; then the same with ``--inject all:bitflip,rate=0.05,timing=intermittent`` and the report's rate and
one-sided 95% bounds per core, which should contain 5%, with one row per failed execution.

    python benchmarks/scan_store_growth.py [--budget 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcguard.fleet.store.store import Store  # noqa: E402


def _scan(db: Path, budget: float, *extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sdcguard",
            "--db",
            str(db),
            "scan",
            "--all",
            "--json",
            "--budget",
            str(budget),
            "--lock-dir",
            str(db.parent / "locks"),
            *extra,
            *(("--drill-store", str(db)) if "--inject" in extra else ()),  # a drill's own store, read as any store
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=8.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.db"
        Store.open(empty).close()
        base = empty.stat().st_size
        for title, extra in (
            ("clean scan", ()),
            ("fire drill at 5%", ("--inject", "all:bitflip,rate=0.05,timing=intermittent")),
        ):
            db = Path(tmp) / f"{title.split()[0]}.db"
            _scan(db, args.budget, *extra)
            with sqlite3.connect(db) as c:
                rows, execs, fails = c.execute(
                    "SELECT COUNT(*), SUM(executions * (attempt = 0)), SUM(passed = 0 AND attempt = 0) FROM results"
                ).fetchone()
                retests = c.execute("SELECT COUNT(*) FROM results WHERE attempt > 0").fetchone()[0]
            size = db.stat().st_size
            print(
                f"{title}: {len(os.sched_getaffinity(0))} cores x {args.budget:g} s: store {size / 1e3:.0f} kB "
                f"(an empty store is {base / 1e3:.0f} kB: +{(size - base) / 1e3:.0f} kB); {rows:,} rows hold "
                f"{execs:,} executions, {fails:,} of them failed (each its own row), {retests} retests"
            )
            if extra:
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                out = subprocess.run(
                    [sys.executable, "-m", "sdcguard", "--db", str(db), "report", "--format", "json"],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                ).stdout
                for r in json.loads(out):
                    inside = r["rate_low"] <= 0.05 <= r["rate_high"]
                    print(
                        f"  {r['device']}: {r['failures']}/{r['executions']} = {r['rate']:.4f}, 95% bounds "
                        f"[{r['rate_low']:.4f}, {r['rate_high']:.4f}] {'contain' if inside else 'MISS'} 5%"
                    )


if __name__ == "__main__":
    main()
