"""``sdcguard report --html`` on a year of data: the page's size and build time, next to the text report's.

The store is built the way the fleet's is (``fleet_scan.sim.scan_sim_device``: the scanner's recording path, the
real suite's 31 cases, the default 60 s budget, one device in 1,000 defective), one scan per device and day for
``--days`` days, pruned every day to ``--keep-days`` of rows (older days live as daily roll-ups, as ``deploy/``
runs it). Then, for the windows 7d, 30d and all: the in-process report (build + JSON) and the HTML page (build),
wall and CPU side by side, and the page's size. ``--db`` measures an existing store instead.

    python benchmarks/report_html.py --devices 300 --days 365      # ~5 minutes on 2 cores
    python benchmarks/report_html.py --db fleet.db                  # a store you have
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from fleet_scan.sim import DEFAULT_CASES, SimFleet, scan_sim_device  # noqa: E402
from sdcguard.devices import sim_id  # noqa: E402
from sdcguard.durations import DAY_S as DAY  # noqa: E402
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy  # noqa: E402
from sdcguard.fleet.report.devices import build_report, report_json  # noqa: E402
from sdcguard.fleet.report.html import build_html  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402
from sdcguard.records import DeviceInfo  # noqa: E402


def build_store(path: Path, *, devices: int, days: int, keep_days: int, now: float) -> None:
    fleet = SimFleet(devices=devices, seed=0)
    p = fleet.failure_probabilities()
    rng = np.random.default_rng(1)
    start = (now // DAY - days) * DAY
    with Store.open(path) as store:
        store.scans.record_devices(
            [DeviceInfo(id=sim_id(n), host=fleet.host(n), kind="sim") for n in range(devices)], now=start
        )
        for day in range(days):
            t = start + day * DAY
            out = {e.device for e in store.quarantine.entries() if e.state == "quarantined"}
            for n in range(devices):
                if sim_id(n) not in out:
                    scan_sim_device(
                        store,
                        dev=sim_id(n),
                        host=fleet.host(n),
                        p_fault=float(p[n]),
                        transient_rate=fleet.transient_rate,
                        t=t + 30.0 * (n % 120),
                        cases=DEFAULT_CASES,
                        past_failures={},
                        budget_s=60.0,
                        retests=3,
                        rng=rng,
                    )
            apply_policy(store, QuarantinePolicy(), now=t + 7200.0)
            if day + 1 > keep_days:
                store.maintenance.prune(before=t + DAY - keep_days * DAY)
        store.maintenance.vacuum()


def _timed(fn: object) -> tuple[object, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def measure(path: Path, now: float) -> None:
    with Store.open(path, create=False) as store:
        count = store.maintenance.row_count
        print(
            f"store {path.stat().st_size / 1e6:.0f} MB: {count('devices'):,} devices, "
            f"{count('results'):,} result rows, {count('rollups'):,} roll-up rows"
        )
        print(f"{'':40}{'wall':>9}{'CPU':>9}{'page':>10}")
        for label, since in (("7d", now - 7 * DAY), ("30d", now - 30 * DAY), ("all", None)):
            _, w, c = _timed(lambda: report_json(build_report(store, since=since)))
            print(f"{'report --format json, ' + label:40}{w:8.2f}s{c:8.2f}s")
            page, w, c = _timed(lambda: build_html(store, since=since, window=label, now=now))
            print(f"{'report --html, ' + label:40}{w:8.2f}s{c:8.2f}s{len(str(page).encode()) / 1e3:8.0f}kB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--keep-days", type=int, default=30)
    ap.add_argument("--db", type=Path, default=None, help="measure this store instead of building one")
    ap.add_argument("--keep", type=Path, default=None, help="build the store here and keep it")
    args = ap.parse_args()
    now = time.time()
    if args.db is not None:
        measure(args.db, now)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = (args.keep or Path(tmp)) / "fleet.db"
        w = time.perf_counter()
        build_store(path, devices=args.devices, days=args.days, keep_days=args.keep_days, now=now)
        print(
            f"{args.devices:,} devices, {args.days} days, pruned to {args.keep_days} days of rows: built in "
            f"{time.perf_counter() - w:.0f} s"
        )
        measure(path, now)


if __name__ == "__main__":
    main()
