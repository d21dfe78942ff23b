"""The fleet store at fleet scale: a year of daily scans of 10,000 devices, recorded the way the scanner records.

Every scan goes through the real recording path (``store.scans.begin`` + ``store.scans.record``, the store folding
each case's passing executions into one row, every failure its own row; ``fleet_scan.sim`` produces the results:
the real suite's 31 cases, the default 60 s budget, one device in 1,000 defective). In order:

1. ``--merge-days`` days (30) of scans into one node store per host of 8 devices (1,250 stores for 10,000
   devices), then the time to merge them all into an empty fleet store, next to a ``SELECT COUNT(*)`` of the
   merged results; then one more day scanned on every node and the merge job's daily incremental merge;
2. the fleet store carried on to ``--days`` days (365): each further day's scans recorded into it, and every day
   ``prune`` rolls scans older than ``--keep-days`` (30, as ``deploy/`` does) into daily counts;
3. on the result: the file's size, a bare ``SELECT COUNT(*) FROM results``, the report (in-process and as the
   CLI, default 7-day window, 30 days, and all time), the HTML page (7 days and all time) and the fleet
   policy's run, wall and CPU time side by side.

Goal: the CLI report over 7 and 30 days under 2 s, in each of three runs, also for windows that start just after
a UTC midnight (their partial first day then holds a whole day's scans). ``--measure DB`` measures a store kept
by an earlier run (migrating it first, timed, if an older sdcguard wrote it). A full year takes about an hour on a
2-core machine: ``--days``, ``--devices`` choose what fits, and the output says exactly what was measured.

    python benchmarks/report_scale.py --devices 10000 --days 365
    python benchmarks/report_scale.py --devices 1000 --days 60 --merge-days 7      # a minute or two
    python benchmarks/report_scale.py --dir /dev/shm/year
    python benchmarks/report_scale.py --measure /dev/shm/year/fleet.db
    python benchmarks/report_scale.py --backend postgresql --devices 10000 --days 31 --merge-days 30

``--backend postgresql``: the fleet store is a PostgreSQL server's (a throwaway one from the distribution's
package, :mod:`sdcguard.testing.postgres`, durable settings: ``fsync`` and ``synchronous_commit`` on; its tuning
is printed): the node stores merged into it, the later days' scans written to it directly, the same measurements.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from fleet_scan.sim import DEFAULT_CASES, SimFleet, scan_sim_device  # noqa: E402
from sdcguard.devices import sim_id  # noqa: E402
from sdcguard.durations import DAY_S as DAY  # noqa: E402
from sdcguard.fleet.merge import merge_stores  # noqa: E402
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy  # noqa: E402
from sdcguard.fleet.report.devices import build_report, report_json  # noqa: E402
from sdcguard.fleet.report.html import build_html  # noqa: E402
from sdcguard.fleet.store.schema.migrations import SCHEMA_VERSION  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402
from sdcguard.records import DeviceInfo  # noqa: E402

_RUNS = 3
"""CLI runs per window: the goal holds in every one, not on average."""


def _scan_day(
    store: Store, fleet: SimFleet, p: np.ndarray, members: list[int], t_day: float, rng: np.random.Generator
) -> int:
    """One day's scans of ``members`` (starting at ``t_day``) into ``store``; returns the scans recorded."""
    for n in members:
        _scan(store, fleet, sim_id(n), fleet.host(n), float(p[n]), t_day + 60.0 * (n % 60), rng)
    return len(members)


def _scan(
    store: Store, fleet: SimFleet, dev: str, host: str, p_fault: float, t: float, rng: np.random.Generator
) -> None:
    """One scan of ``dev`` at ``t``, through the scanner's recording path (the real suite, 60 s, 3 retests)."""
    scan_sim_device(
        store,
        dev=dev,
        host=host,
        p_fault=p_fault,
        transient_rate=fleet.transient_rate,
        t=t,
        cases=DEFAULT_CASES,
        past_failures={},
        budget_s=60.0,
        retests=3,
        rng=rng,
    )


def _node_stores(job: tuple[Path, SimFleet, list[str], float, int, int]) -> int:
    """Build (or carry on) the node stores of some hosts: days ``first``..``first + days - 1`` from ``start``."""
    directory, fleet, hosts, start, first, days = job
    p = fleet.failure_probabilities()
    scans = 0
    for host in hosts:
        members = [n for n in range(fleet.devices) if fleet.host(n) == host]
        rng = np.random.default_rng([fleet.seed, int(host[7:]), first])
        with Store.open(directory / f"{host}.db") as store:
            store.scans.record_devices([DeviceInfo(id=sim_id(n), host=host, kind="sim") for n in members], now=start)
            for day in range(first, first + days):
                scans += _scan_day(store, fleet, p, members, start + day * DAY, rng)
    return scans


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def _child(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def _row(label: str, wall: float, cpu: float, floor: float | None = None) -> None:
    ratio = f"   ({wall / floor:.0f}x COUNT(*) wall)" if floor else ""
    print(f"{label:48}{wall:8.3f}s{cpu:8.3f}s{ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--merge-days", type=int, default=30)
    ap.add_argument("--keep-days", type=int, default=30, help="prune horizon (sdcguard prune --before Nd)")
    ap.add_argument(
        "--then-keep",
        type=int,
        nargs="*",
        default=[],
        help="then prune the same store to these shorter horizons (days) and measure again",
    )
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--dir", type=Path, default=None, help="keep the stores here (default: a temporary directory)")
    ap.add_argument(
        "--measure",
        default=None,
        metavar="DB",
        help="only measure (step 3) a fleet store an earlier run kept with --dir, on the same day (a file, or a "
        "server store's postgresql:// URL: migrated, then VACUUM (ANALYZE), both timed)",
    )
    ap.add_argument("--cli-only", action="store_true", help="with --measure: only the CLI report's runs")
    ap.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite", help="the fleet store's backend")
    ap.add_argument(
        "--via-file",
        action="store_true",
        help="the node stores merged into a fleet file, the file into the server once (then no day carried on)",
    )
    args = ap.parse_args()
    if args.measure is not None:
        print(f"3. {args.measure}, recorded by an earlier run that ended today:")
        measured: Any = args.measure if args.measure.startswith("postgresql://") else Path(args.measure)
        _migrate(measured)
        if args.cli_only:
            _measure_cli(measured)
        else:
            _measure(measured, (time.time() // DAY) * DAY, args.keep_days)
        return
    if args.days < args.merge_days:
        raise SystemExit("--days must be at least --merge-days")
    tmp = tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    base = args.dir or Path(tmp.name)
    (base / "nodes").mkdir(parents=True, exist_ok=True)
    if args.backend == "postgresql":
        from sdcguard.testing.postgres import PostgresServer

        with PostgresServer(settings=SERVER_SETTINGS) as server:  # stopped and deleted at the end
            print(f"PostgreSQL {server.admin('SHOW server_version')[0][0]}, settings {SERVER_SETTINGS}")
            _run(args, base, server.url())
    else:
        _run(args, base, base / "fleet.db")


def _run(args: argparse.Namespace, base: Path, fleet_db: Any) -> None:
    """Steps 1 to 3 (the module docstring) with the fleet store at ``fleet_db``."""
    nodes_dir = base / "nodes"
    fleet = SimFleet(devices=args.devices, seed=0)
    hosts = sorted({fleet.host(n) for n in range(fleet.devices)})
    start = (time.time() // DAY - args.days) * DAY  # the simulated year ends today, so the CLI's windows hold it
    t0 = time.perf_counter()
    chunks = [(nodes_dir, fleet, hosts[i :: args.workers], start, 0, args.merge_days) for i in range(args.workers)]
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        scans = sum(pool.map(_node_stores, chunks))
    build_nodes = time.perf_counter() - t0
    node_paths = [nodes_dir / f"{h}.db" for h in hosts]

    if args.via_file:
        _via_file(base / "fleet.db", fleet_db, node_paths, scans, build_nodes, args)
        return
    stats, t_merge, c_merge = _timed(lambda: merge_stores(fleet_db, node_paths))
    with Store.open(fleet_db, create=False, readonly=True) as store:
        merged_rows, t_count0, c_count0 = _timed(lambda: store.maintenance.row_count("results"))
    print(
        f"1. {len(node_paths):,} node stores of {args.merge_days} days ({scans:,} scans of {len(DEFAULT_CASES)} "
        f"cases, recorded in {build_nodes:.0f} s on {args.workers} processes), merged into an empty fleet store:"
    )
    print(f"{'':48}{'wall':>9}{'CPU':>9}")
    _row(f"SELECT COUNT(*) FROM results ({merged_rows:,} rows)", t_count0, c_count0)
    _row(f"merge {len(node_paths):,} node stores ({sum(s.results for s in stats):,} rows)", t_merge, c_merge, t_count0)
    _, t_again, c_again = _timed(lambda: merge_stores(fleet_db, node_paths))
    _row("  the same merge again (nothing new)", t_again, c_again, t_count0)
    # The merge job's daily run: every node scanned one more day, then one incremental merge of every node store.
    chunks = [(nodes_dir, fleet, hosts[i :: args.workers], start, args.merge_days, 1) for i in range(args.workers)]
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        scans += sum(pool.map(_node_stores, chunks))
    day_stats, t_day, c_day = _timed(lambda: merge_stores(fleet_db, node_paths))
    _row(
        f"  a day's incremental merge of {len(node_paths):,} stores ({sum(s.results for s in day_stats):,} rows)",
        t_day,
        c_day,
        t_count0,
    )

    p = fleet.failure_probabilities()
    rng = np.random.default_rng([fleet.seed, 99])
    t0 = time.perf_counter()
    t_prune = 0.0
    with Store.open(fleet_db) as store:
        for day in range(args.merge_days + 1, args.days):
            scans += _scan_day(store, fleet, p, list(range(fleet.devices)), start + day * DAY, rng)
            w = time.perf_counter()
            store.maintenance.prune(before=start + (day + 1 - args.keep_days) * DAY)
            t_prune += time.perf_counter() - w
            if (day + 1) % 30 == 0:
                print(
                    f"   ... day {day + 1} of {args.days} recorded ({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        store.maintenance.vacuum()
    year = time.perf_counter() - t0
    now = start + args.days * DAY
    print(
        f"\n2. carried on to {args.days} days of {args.devices:,} devices ({scans:,} scans in all; days "
        f"{args.merge_days + 1}..{args.days - 1} recorded into the fleet store in {year:.0f} s, of which prune "
        f"--before {args.keep_days}d every day {t_prune:.0f} s), then vacuumed:"
    )
    _measure(fleet_db, now, args.keep_days)
    for keep in args.then_keep:
        with Store.open(fleet_db) as store:
            store.maintenance.prune(before=now - keep * DAY)
            store.maintenance.vacuum()
        print(f"\n3. the same store pruned further, to {keep} days of rows:")
        _measure(fleet_db, now, keep)


def _via_file(file_db: Path, fleet_db: Any, node_paths: list[Path], scans: int, build_s: float, args: Any) -> None:
    """``--via-file``: the node stores merged into a SQLite fleet file, that file merged into the server in one
    transaction (what a fleet moving from files to a server does once), then the measurements."""
    stats, t_merge, c_merge = _timed(lambda: merge_stores(file_db, node_paths))
    (load,), t_load, c_load = _timed(lambda: merge_stores(fleet_db, [file_db]))
    with Store.open(fleet_db, create=False, readonly=True) as store:
        rows, t_count, c_count = _timed(lambda: store.maintenance.row_count("results"))
    print(
        f"1. {len(node_paths):,} node stores of {args.merge_days} days ({scans:,} scans of {len(DEFAULT_CASES)} "
        f"cases, recorded in {build_s:.0f} s on {args.workers} processes), merged into a fleet file, the file "
        "merged into the server:"
    )
    print(f"{'':48}{'wall':>9}{'CPU':>9}")
    _row(f"SELECT COUNT(*) FROM results ({rows:,} rows)", t_count, c_count)
    _row(f"merge {len(node_paths):,} node stores into the file", t_merge, c_merge)
    _row(f"merge the file into the server ({load.results:,} rows)", t_load, c_load, t_count)
    print(
        f"\n2. measured at {args.merge_days} days of {args.devices:,} devices ({sum(s.scans for s in stats):,} scans):"
    )
    now = time.time()
    _measure(fleet_db, now, args.keep_days)


SERVER_SETTINGS = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "shared_buffers": "1GB",
    "work_mem": "64MB",
    "max_wal_size": "4GB",
    "max_parallel_workers_per_gather": "2",
}
"""The benchmark server's settings (what docs/postgresql.md's sizing starts from)."""


def _size(fleet_db: Any) -> int:
    if isinstance(fleet_db, Path):
        return fleet_db.stat().st_size
    import psycopg

    with psycopg.connect(fleet_db) as c:  # the store's schema (a server may hold several stores)
        return int(
            c.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n ON "
                "n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'm')"
            ).fetchone()[0]
        )


def _measure(fleet_db: Any, now: float, keep: int) -> None:
    size = _size(fleet_db)
    with Store.open(fleet_db, create=False, readonly=True) as store:
        count = store.maintenance.row_count
        rows, t_count, c_count = _timed(lambda: count("results"))
        print(
            f"store: {size / 1e6:.0f} MB; {rows:,} result rows (the last {keep} days), "
            f"{count('scans'):,} scans, {count('rollups'):,} daily roll-up rows; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(f"{'':48}{'wall':>9}{'CPU':>9}")
        _row("SELECT COUNT(*) FROM results", t_count, c_count)
        for label, since in (
            ("report in-process, 7 days (build + JSON)", now - 7 * DAY),
            ("report in-process, all time", None),
        ):
            _, w, c = _timed(lambda: report_json(build_report(store, since=since)))
            _row(label, w, c, t_count)
        for label, since in (("7d", now - 7 * DAY), ("all", None)):
            page, w, c = _timed(lambda: build_html(store, since=since, window=label, now=now))
            _row(f"report --html in-process, {label} ({len(page.encode()) / 1e3:.0f} kB)", w, c, t_count)
    # the policy as the merge job runs it: the whole fleet, fleet scope
    with Store.open(fleet_db) as store:
        out, t_pol, c_pol = _timed(lambda: apply_policy(store, QuarantinePolicy(), now=now))
    _row(f"fleet policy ({len(out.quarantined)} quarantined)", t_pol, c_pol, t_count)
    for label, extra in (
        ("  ... --since all", ["--since", "all"]),
        ("  ... --since all --families", ["--since", "all", "--families"]),
    ):
        wall, cpu, _ = _child(["-m", "sdcguard", "--db", str(fleet_db), "report", "--format", "json", *extra])
        _row(label, wall, cpu, t_count)
    wall, cpu, _ = _child(["-c", "import sdcguard.cli.report, sdcguard.fleet.report.devices"])
    _row("  of which interpreter + imports", wall, cpu)
    _measure_cli(fleet_db)


def _migrate(fleet_db: Any) -> None:
    """Open the store once with this code, migrating it (timed) if an older sdcguard wrote it; a server store is
    then vacuumed (timed: the visibility map and statistics autovacuum keeps on a server at rest, which a store
    just loaded by one large merge lacks)."""
    if not isinstance(fleet_db, Path):
        print(f"{'':48}{'wall':>9}{'CPU':>9}")
        _, wall, cpu = _timed(lambda: Store.open(fleet_db).close())
        _row(f"open (migrating to schema {SCHEMA_VERSION} if older)", wall, cpu)
        with Store.open(fleet_db) as store:
            _, wall, cpu = _timed(store.vacuum)
        _row("VACUUM (ANALYZE)", wall, cpu)
        return
    with open(fleet_db, "rb") as f:
        version = int.from_bytes(f.read(100)[60:64], "big")
    if version >= SCHEMA_VERSION:
        return
    _, wall, cpu = _timed(lambda: Store.open(fleet_db).close())
    print(f"{'':48}{'wall':>9}{'CPU':>9}")
    _row(f"migration from schema {version} to {SCHEMA_VERSION}", wall, cpu)


def _server_cpu(fleet_db: Any) -> Callable[[], float]:
    """For a server on this machine: a clock of the CPU seconds of its exited processes (the postmaster's reaped
    children: a report's backend exits with its connection), what a report costs the server beside the CLI's own
    CPU; a long-running backend (another client's merge) does not count until it exits, an autovacuum worker that
    exits meanwhile does. NaN for a file or a remote server."""
    if isinstance(fleet_db, Path):
        return lambda: float("nan")
    import psycopg

    with psycopg.connect(fleet_db) as c:
        data = c.execute("SELECT current_setting('data_directory')").fetchone()
    try:
        pid = int(Path(str(data[0] if data else ""), "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError):
        return lambda: float("nan")
    tick = os.sysconf("SC_CLK_TCK")

    def clock() -> float:
        time.sleep(0.2)  # the report's backend reaped by the postmaster
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime

    return clock


_QUARTER = 900.0
"""How old a kept report is at worst under a CronJob that refreshes it every 15 minutes (deploy/)."""


def _quarter_hour(fleet_db: Any, start: float) -> int:
    """The devices a quarter hour from ``start`` changes in a report of a fleet that scans each device once a day at
    any time of day: a 96th of them scan, and a 96th more have their scan of a week (a month) ago leave the window.
    The stores here scan in each day's first hour, so the window's start passes no scan at most times of day: every
    48th device is scanned instead, through the real recording path, from ``start`` on; returns how many."""
    with Store.open(fleet_db) as store:
        known = store.scans.devices()
        fleet = SimFleet(devices=len(known), seed=0)
        p = fleet.failure_probabilities()
        rng = np.random.default_rng([fleet.seed, 15])
        picked = known[:: round(DAY / _QUARTER / 2)]
        for k, d in enumerate(picked):
            n = int(d.id.rpartition(":")[2])
            _scan(store, fleet, d.id, d.host, float(p[n % len(p)]), start + _QUARTER * k / len(picked), rng)
    return len(picked)


def _keep_at(fleet_db: Any, at: float, windows: list[float]) -> None:
    """What ``sdcguard db refresh`` keeps, as of ``at``: each window's slowness verdicts, then its report."""
    from sdcguard.fleet.report.kept import keep_report
    from sdcguard.fleet.slow import SlowSettings
    from sdcguard.fleet.slow_fleet import fleet_slowness

    policy = QuarantinePolicy()  # the settings the CLI reads from no configuration file
    slow = SlowSettings(threshold=policy.slow_threshold, confidence=policy.confidence)
    with Store.open(fleet_db) as store:
        for length in windows:
            fleet_slowness(store, since=at - length, now=at, settings=slow, keep=True)
            keep_report(store, since=at - length, now=at, slow=slow, breaker=policy, slow_max_age_s=1.0)


def _kept_rows(fleet_db: Any, window: str) -> str:
    """What a report of ``window`` now reads of the kept one: how many rows it computes, or that none is used."""
    from sdcguard.durations import since_timestamp
    from sdcguard.fleet.report.kept import kept_lines
    from sdcguard.fleet.slow import SlowSettings

    policy, now = QuarantinePolicy(), time.time()
    slow = SlowSettings(threshold=policy.slow_threshold, confidence=policy.confidence)
    with Store.open(fleet_db, create=False, readonly=True) as store:
        lines = kept_lines(
            store, since=since_timestamp(window, now=now), now=now, slow=slow, breaker=policy, slow_max_age_s=3600
        )
    if lines is None:
        return "no kept report: every row computed"
    computed = sum(not isinstance(x, str) for *_, x in lines.lines)
    return f"kept report read, {computed:,} of {len(lines):,} rows computed"


def _measure_cli(fleet_db: Any) -> None:
    """The CLI report over 7 and 30 days, :data:`_RUNS` runs each, and whether every run met the goal; then the
    same windows started just after a UTC midnight, so that their partial first day holds a whole day of rows (the
    stores here scan in each day's first hour: at most other times of day that partial day is empty).

    First ``sdcguard db refresh`` keeps the slowness verdicts and the report of those four windows (timed), as a
    fleet's CronJob does; the 7- and 30-day ones are then kept again as of a quarter hour ago (a CronJob every 15
    minutes leaves them that old at worst; the midnight windows' are as the CronJob's run at midnight keeps them,
    a refresh before midnight being of other whole days), and a quarter hour of scans is recorded after them: each
    run reads the kept report and computes the rows of the devices that scanned since, or whose oldest evidence
    left the window since (the report's default). Beside them, one run per window with ``--computed`` (every row
    computed, the kept verdicts read: what every report did before) and one with ``--slow-max-age 0`` (the
    verdicts computed too)."""
    worst = 0.0
    server_cpu = _server_cpu(fleet_db)
    midnight = time.time() // DAY * DAY + 2.0
    windows = (
        ("7 days", "7d"),
        ("30 days", "30d"),
        ("7 days from a midnight", f"{time.time() - midnight + 7 * DAY:.0f}s"),
        ("30 days from a midnight", f"{time.time() - midnight + 30 * DAY:.0f}s"),
    )
    refresh = ["-m", "sdcguard", "--db", str(fleet_db), "db", "refresh"]
    wall, cpu, _ = _child([*refresh, *(x for _, w in windows for x in ("--window", w))])
    print(f"sdcguard db refresh of the {len(windows)} windows: {wall:.2f} s ({cpu:.2f} s CPU)")
    kept_at = time.time() - _QUARTER
    _keep_at(fleet_db, kept_at, [7 * DAY, 30 * DAY])
    scanned, w_scan, _ = _timed(lambda: _quarter_hour(fleet_db, kept_at))
    print(
        f"kept again as of {_QUARTER / 60:.0f} minutes ago (7 and 30 days); then {scanned:,} scans recorded "
        f"({w_scan:.1f} s): the devices a quarter hour changes in a daily-scanned fleet"
    )
    for label, window in windows:
        load = os.getloadavg()[0]
        runs, served = [], []
        report = ["-m", "sdcguard", "--db", str(fleet_db), "report", "--format", "json", "--since", window]
        for _ in range(_RUNS):
            before = server_cpu()
            runs.append(_child(report))
            served.append(server_cpu() - before)
        computed, _, _ = _child([*report, "--computed"])
        live, _, _ = _child([*report, "--slow-max-age", "0"])
        worst = max(worst, *(w for w, _, _ in runs))
        print(
            f"sdcguard report --format json (CLI, {label}; {_kept_rows(fleet_db, window)}), {_RUNS} runs: "
            + ", ".join(
                f"{w:.2f} s ({c:.2f} s CPU{f', server {v:.2f} s' if v == v else ''})"
                for (w, c, _), v in zip(runs, served)
            )
            + f"; --computed {computed:.2f} s; --slow-max-age 0 {live:.2f} s; load average {load:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after"
        )
    print(
        f"goal: CLI report over 7 and 30 days < 2 s in every run -> {'met' if worst < 2.0 else 'NOT met'} "
        f"(slowest {worst:.2f} s; load average {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
