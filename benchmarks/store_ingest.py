"""Many scanners writing to one fleet store at once: results per second from N concurrent writers, SQLite (one
file, the writers taking turns) and PostgreSQL (a connection each) side by side, then how soon a finished scan is
in the report.

Each writer is a process with its own connection, recording scans the way the scanner does
(``fleet_scan.device_scan.record``): ``store.scans.begin``, then batches of 256 results (the real suite's 31 case ids,
passing first attempts folded by the store into one row per case, one failure in 1,000), the last batch with the
final status. All writers start together (a barrier) and the clock runs from the barrier to the last commit.
A "result" is one execution a scanner recorded (a ``CaseResult``); the rows the store writes are fewer (folding).

Then, on the server: one more scan finishes, and the report (in-process, a second connection; then the CLI) is
asked for that device at once: the seconds from the last commit to a report that shows the scan.

The PostgreSQL server is a throwaway one from the distribution's package (:mod:`sdcguard.testing.postgres`), on
this machine, with durable commits (``fsync``, ``synchronous_commit`` on); the settings are printed.

    python benchmarks/store_ingest.py                       # 100 writers, 20 scans of 2 batches each
    python benchmarks/store_ingest.py --writers 20 --scans 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcguard.durations import DAY_S  # noqa: E402
from sdcguard.fleet.report.devices import build_report  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402
from sdcguard.records import CaseResult  # noqa: E402
from sdcguard.testing.postgres import PostgresServer  # noqa: E402

BATCH = 256
CASES = [f"case-{i:02d}" for i in range(31)]
SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "512MB",
    "max_connections": "250",
}


def _batch(device: str, t: float, k: int) -> list[CaseResult]:
    return [
        CaseResult(
            device=device,
            case=CASES[i % len(CASES)],
            family="gemm",
            seed=i,
            passed=(k * BATCH + i) % 1000 != 7,
            duration_s=0.01,
            started_at=t + i * 0.01,
            output_digest="ab" * 32,
        )
        for i in range(BATCH)
    ]


def _writer(job: tuple[str, int, int, int, Any]) -> tuple[int, float]:
    db, w, scans, batches, barrier = job
    device = f"sim:{w}"
    with Store.open(db) as store:
        barrier.wait()
        n = 0
        for s in range(scans):
            t = 1.8e9 + s * 3600.0
            sid = store.scans.begin(device=device, host=f"node{w // 8}", budget_s=60.0, started_at=t)
            for k in range(batches):
                rows = _batch(device, t + k * 3.0, k)
                store.scans.record(sid, rows, finish="complete" if k == batches - 1 else None, finished_at=t + 60)
                n += len(rows)
        return n, time.perf_counter()


def _ingest(db: str, writers: int, scans: int, batches: int) -> tuple[int, float]:
    Store.open(db).close()
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(writers + 1)
        with ctx.Pool(writers) as pool:
            pending = pool.map_async(_writer, [(db, w, scans, batches, barrier) for w in range(writers)])
            barrier.wait()
            start = time.perf_counter()
            done = pending.get()
    return sum(n for n, _ in done), max(t for _, t in done) - start


def _visible(db: str) -> tuple[float, float]:
    """Seconds from a scan's last commit to a report (in-process on another connection; the CLI) showing it."""
    with Store.open(db) as writer, Store.open(db) as reader:
        sid = writer.scans.begin(device="sim:fresh", host="node-x", budget_s=60.0, started_at=time.time() - 60)
        writer.scans.record(sid, _batch("sim:fresh", time.time() - 59, 0), finish="complete")
        t0 = time.perf_counter()
        rows = build_report(reader, since=time.time() - DAY_S, device="sim:fresh")
        assert rows and rows[0].scans == 1
        in_process = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "sdcguard", "--db", db, "report", "--device", "sim:fresh", "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    cli = time.perf_counter() - t0
    assert p.returncode in (0, 1) and '"sim:fresh"' in p.stdout, p.stderr
    return in_process, cli


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=100)
    ap.add_argument("--scans", type=int, default=20, help="scans per writer")
    ap.add_argument("--batches", type=int, default=2, help="batches of 256 results per scan")
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    args = ap.parse_args()
    print(
        f"{args.writers} writers x {args.scans} scans x {args.batches} batches of {BATCH} results; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp, PostgresServer(settings=SETTINGS) as server:
        print(f"PostgreSQL {server.admin('SHOW server_version')[0][0]}, settings {SETTINGS}")
        for backend in args.backends:
            db = str(Path(tmp) / "ingest.db") if backend == "sqlite" else server.url()
            n, wall = _ingest(db, args.writers, args.scans, args.batches)
            with Store.open(db) as s:
                (t,) = s.counts.tallies(by="family")
                assert t.executions == n, (t.executions, n)  # nothing lost, nothing twice
                rows = s.maintenance.row_count("results")
            print(
                f"{backend:10} {n:,} results ({rows:,} rows) in {wall:.2f} s: {n / wall:,.0f} results/s, "
                f"{args.writers * args.scans * args.batches / wall:,.0f} transactions/s; load average "
                f"{os.getloadavg()[0]:.1f}"
            )
            in_process, cli = _visible(db)
            print(f"{'':10} a finished scan in the report after {in_process:.3f} s in-process, {cli:.2f} s by the CLI")


if __name__ == "__main__":
    main()
