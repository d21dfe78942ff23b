"""How long `sdcguard report --format json` takes on a fleet-sized store, next to a bare COUNT(*).

Builds a store of 1,000,000 results over 10,000 devices (bulk insert through the store's own schema), then
times, in the same run:

- ``SELECT COUNT(*) FROM results`` (the floor: SQLite touching every row once);
- the report computed in-process (``build_report`` + JSON), which is what the CLI spends after start-up;
- ``python -m sdcguard report --format json --since all`` as a user runs it (interpreter start-up and imports
  included), and the same with ``--families``.

Wall and CPU time are printed side by side with the load average: on a shared machine the wall time of one run
swings with the load, the CPU time much less.

Goal: the CLI report under 2 s. Usage: ``python benchmarks/report_scale.py [--devices N] [--results N] [--db PATH]``.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcguard.fleet.report import build_report, report_json  # noqa: E402
from sdcguard.fleet.store import Store  # noqa: E402

FAMILIES = ("gemm", "alu", "ieee", "intrinsics", "memory", "shared")


def build(path: Path, n_devices: int, n_results: int, *, scans_per_device: int = 5, seed: int = 0) -> float:
    """Fill ``path``; returns seconds spent."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    now = time.time()
    per_scan = max(1, n_results // (n_devices * scans_per_device))
    bad = set(rng.sample(range(n_devices), max(1, n_devices // 1000)))  # ~1 in 1,000 devices corrupts
    with Store.open(path) as store:
        conn = store._conn
        conn.execute("PRAGMA synchronous = OFF")
        with store.write():
            conn.executemany(
                "INSERT INTO devices(id, host, kind, idx, first_seen, last_seen) VALUES (?, ?, 'sim', ?, ?, ?)",
                ((f"sim:{d}", f"node{d // 8:04d}", d, now - 7 * 86400, now) for d in range(n_devices)),
            )
            scans = []
            for d in range(n_devices):
                for s in range(scans_per_device):
                    start = now - 6 * 86400 + (s * 86400) + rng.random() * 3600
                    scans.append((uuid.uuid4().hex, f"sim:{d}", f"node{d // 8:04d}", start, start + 60, 60.0))
            conn.executemany(
                "INSERT INTO scans(uuid, device, host, started_at, finished_at, budget_s, status) "
                "VALUES (?, ?, ?, ?, ?, ?, 'complete')",
                scans,
            )
            ids = [r[0] for r in conn.execute("SELECT id FROM scans ORDER BY id")]

            def rows():
                for i, sid in enumerate(ids):
                    d = i // scans_per_device
                    start = scans[i][3]
                    for q in range(per_scan):
                        fam = FAMILIES[q % len(FAMILIES)]
                        passed = 0 if d in bad and rng.random() < 0.05 else 1
                        yield (sid, q, f"sim:{d}", f"{fam}.case{q % 4}", fam, q, passed, 0.05, start + q * 0.05, "{}")

            conn.executemany(
                "INSERT INTO results(scan, seq, device, case_id, family, seed, passed, duration_s, started_at, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows(),
            )
            conn.execute(
                "UPDATE scans SET executions = (SELECT COUNT(*) FROM results r WHERE r.scan = scans.id), "
                "failures = (SELECT COUNT(*) FROM results r WHERE r.scan = scans.id AND r.passed = 0)"
            )
        conn.execute("ANALYZE")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--results", type=int, default=1_000_000)
    ap.add_argument("--db", type=Path, default=None, help="reuse/keep the store here (default: a temp dir)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    path = args.db or Path(tmp.name) / "fleet.db"
    if not path.exists():
        secs = build(path, args.devices, args.results)
        print(f"built {path} in {secs:.1f} s ({path.stat().st_size / 1e6:.0f} MB)")
    with Store.open(path, create=False) as store:
        w0, c0 = time.perf_counter(), time.process_time()
        count = store.scalar("SELECT COUNT(*) FROM results")
        t_count, c_count = time.perf_counter() - w0, time.process_time() - c0
        w0, c0 = time.perf_counter(), time.process_time()
        rows = build_report(store, since=None)
        text = report_json(rows)
        t_lib, c_lib = time.perf_counter() - w0, time.process_time() - c0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def child(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w = time.perf_counter()
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - w
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc

    t_cli, c_cli, proc = child(["-m", "sdcguard", "--db", str(path), "report", "--format", "json", "--since", "all"])
    if proc.returncode != 0:
        raise SystemExit(f"report failed: {proc.stderr.strip()}")
    t_fam, c_fam, proc = child(
        ["-m", "sdcguard", "--db", str(path), "report", "--format", "json", "--since", "all", "--families"]
    )
    if proc.returncode != 0:
        raise SystemExit(f"report --families failed: {proc.stderr.strip()}")
    t_start, c_start, _ = child(["-c", "import sdcguard.cli.report, sdcguard.fleet.report"])
    load = os.getloadavg()[0]
    print(f"results: {count:,} over {len(rows):,} devices ({len(text) / 1e6:.1f} MB of JSON); "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'':38}{'wall':>9}{'CPU':>9}")
    print(f"{'SELECT COUNT(*) FROM results':38}{t_count:8.3f}s{c_count:8.3f}s")
    print(f"{'report in-process (build + JSON)':38}{t_lib:8.3f}s{c_lib:8.3f}s   "
          f"({t_lib / max(t_count, 1e-9):.0f}x COUNT(*) wall)")
    print(f"{'sdcguard report --format json (CLI)':38}{t_cli:8.3f}s{c_cli:8.3f}s   "
          f"({t_cli / max(t_count, 1e-9):.0f}x COUNT(*) wall)")
    print(f"{'  of which interpreter + imports':38}{t_start:8.3f}s{c_start:8.3f}s")
    print(f"{'  ... --families (per-family rates)':38}{t_fam:8.3f}s{c_fam:8.3f}s   "
          f"({t_fam / max(t_count, 1e-9):.0f}x COUNT(*) wall)")
    verdict = "met" if t_cli < 2.0 else ("NOT met on wall time" + (" (CPU time meets it)" if c_cli < 2.0 else ""))
    print(f"goal: CLI report < 2 s -> {verdict}")


if __name__ == "__main__":
    main()
