"""``sdcguard plan`` against a fixed interval and the fleet-average answer, side by side in one run.

A simulated fleet of ``--fleet`` devices goes into a SQLite store: each device ``--test-hours`` of golden scans and
its failures drawn from its true rate (most devices at a base rate set so that a 16,384-device job is interrupted
every ~1.8 h, Meta's projection; ``--lemon-share`` of them ``--lemon-factor`` times as often). A job's allocation of
``--devices`` of them holds lemons at ``--allocation-lemons`` times the fleet's share (a 504-GPU B200 report found 3
of 63 nodes behind most exclusions). Three checkpoint intervals, each Daly's where it is a plan:

- ``fixed``: ``--fixed`` seconds, the interval frameworks take by hand;
- ``fleet average``: the fleet's rate (failures per test-hour of every device) times the allocation's size;
- ``allocation``: ``sdcguard plan``'s, from the store's rates of exactly these devices
  (:func:`sdcguard.fleet.plan.allocation.read_allocation`).

Each runs the job for ``--days`` days ``--repeats`` times with interruptions drawn from the allocation's true rates
(each costs the work since the last checkpoint and ``--restart`` seconds; a checkpoint blocks ``--checkpoint``
seconds), and the goodput (useful work over wall time) is printed for each, with the ratio to the allocation's::

    python benchmarks/plan_goodput.py            # 65,536 devices in the store, a 16,384-device job: a few minutes
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sdcguard.durations import DAY_S  # noqa: E402
from sdcguard.fleet.plan.allocation import read_allocation  # noqa: E402
from sdcguard.fleet.plan.intervals import daly  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402
from sdcguard.records import CaseResult, DeviceInfo  # noqa: E402

T0 = 1_700_000_000.0


def _row(device: str, passed: bool, t: float, seconds: float) -> CaseResult:
    return CaseResult(
        device=device,
        case="gemm.fp32.n64",
        family="gemm",
        seed=7,
        passed=passed,
        duration_s=seconds,
        started_at=t,
        output_digest=None if passed else "ab" * 32,
        mismatches=0 if passed else 1,
        element=None if passed else 3,
        expected=None if passed else "0x3f800000",
        actual=None if passed else "0x3f800001",
        xor_mask=None if passed else "0x1",
    )


def fill_store(path: Path, rates_per_hour: np.ndarray, test_hours: float, rng: np.random.Generator) -> None:
    """One scan per device: ``test_hours`` of passing testing and its failures drawn from its rate."""
    failures = rng.poisson(rates_per_hour * test_hours)
    with Store.open(path) as store:
        store.scans.record_devices(
            [DeviceInfo(id=f"sim:{i}", host=f"node{i // 8}", kind="sim") for i in range(len(rates_per_hour))], now=T0
        )
        for i, k in enumerate(failures.tolist()):
            d = f"sim:{i}"
            sid = store.scans.begin(device=d, host=f"node{i // 8}", budget_s=60.0, started_at=T0)
            rows = [_row(d, True, T0 + 1, test_hours * 3600.0)] + [_row(d, False, T0 + 2 + j, 0.0) for j in range(k)]
            store.scans.record(sid, rows, finish="complete", finished_at=T0 + 60)


def simulate(interval: float, checkpoint: float, restart: float, rate_per_s: float, days: float, seed: int) -> float:
    """Useful work over wall time of a job checkpointing every ``interval`` seconds of work, interrupted at
    ``rate_per_s`` (exponential), each interruption costing the work since the checkpoint and ``restart``."""
    rng = np.random.default_rng(seed)
    wall, work, end = 0.0, 0.0, days * DAY_S
    while wall < end:
        t = rng.exponential(1.0 / rate_per_s)
        if t >= interval + checkpoint:
            wall += interval + checkpoint
            work += interval
        else:
            wall += t + restart
    return work / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", type=int, default=65_536)
    ap.add_argument("--devices", type=int, default=16_384)
    ap.add_argument("--lemon-share", type=float, default=0.005)
    ap.add_argument("--lemon-factor", type=float, default=30.0)
    ap.add_argument("--allocation-lemons", type=float, default=3.0)
    ap.add_argument("--test-hours", type=float, default=2000.0)
    ap.add_argument("--checkpoint", type=float, default=60.0)
    ap.add_argument("--restart", type=float, default=600.0)
    ap.add_argument("--fixed", type=float, default=3600.0)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    base = 1.0 / (1.8 * 16_384)  # per device-hour: a 16,384-device job interrupted every ~1.8 h
    lemon = rng.random(args.fleet) < args.lemon_share
    # the allocation: its first devices, with lemons at allocation_lemons times the fleet's share
    alloc = np.arange(args.devices)
    lemon[alloc] = rng.random(args.devices) < args.lemon_share * args.allocation_lemons
    rates = np.where(lemon, base * args.lemon_factor, base)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "fleet.db"
        t = time.perf_counter()
        fill_store(db, rates, args.test_hours, rng)
        filled = time.perf_counter() - t
        t = time.perf_counter()
        with Store.open(db, readonly=True) as store:
            allocation = read_allocation(store, [f"sim:{i}" for i in alloc], since=T0 - DAY_S)
        read = time.perf_counter() - t
    true_per_s = float(rates[alloc].sum()) / 3600.0
    plans = {
        "fixed": args.fixed,
        "fleet average": daly(args.checkpoint, 3600.0 / (allocation.fleet_per_hour * args.devices)),
        "allocation": daly(args.checkpoint, 3600.0 / allocation.per_hour),
    }
    print(
        f"fleet {args.fleet:,} devices ({int(lemon.sum())} lemons at {args.lemon_factor:g}x), a job of "
        f"{args.devices:,} ({int(lemon[alloc].sum())} lemons); store filled in {filled:.1f} s, the allocation read "
        f"in {read:.2f} s; true mean time between interruptions {1 / true_per_s / 3600:.2f} h, the plan's "
        f"{1 / allocation.per_hour:.2f} h, the fleet average's {1 / (allocation.fleet_per_hour * args.devices):.2f} h"
    )
    goodput = {
        name: float(
            np.mean(
                [
                    simulate(interval, args.checkpoint, args.restart, true_per_s, args.days, args.seed + r)
                    for r in range(args.repeats)
                ]
            )
        )
        for name, interval in plans.items()
    }
    best = goodput["allocation"]
    for name, interval in plans.items():
        print(
            f"{name:>14}: interval {interval / 60:7.1f} min  goodput {goodput[name]:.4f}  "
            f"(x{goodput[name] / best:.4f} of the allocation's plan)"
        )
    assert all(math.isfinite(g) for g in goodput.values())


if __name__ == "__main__":
    main()
