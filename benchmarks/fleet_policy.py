"""The quarantine policy on a simulated fleet deployed as shipped: per-node stores, the merge, both policies.

Every day each device not quarantined is scanned into its host's node store with the scanner's default budget
(``fleet_scan.sim``: the real suite's cases, rows folded per (scan, case) by the store as for the scanner, every
failed execution its own row), each node applies the node policy to its own store, the fleet store merges every
node store (incrementally) and the fleet policy runs on it: what ``deploy/`` does.

Scenarios:

- ``clean``: one device in 1,000 defective, with a per-execution failure probability log-uniform in
  [1e-5, 1e-1]; a rare transient rate on every device (healthy ones too).
- ``bad``: the same fleet; on ``--bad-day`` a bad golden file is rolled out (every device fails one case with
  its right answer, which the bad file calls wrong, and reproduces it on retest), rolled back the next day.
- ``shared``: the same fleet plus a batch of ``--shared-devices`` devices sharing one defect: one case, the same
  wrong output on each of them (a quarter of the batch's hosts hold two of it).
- ``slow``: the clean fleet plus ``--slow-devices`` devices slower than their peers (log-uniform between
  ``--slow-low`` and ``--slow-high`` times the nominal time), every device's own lasting speed spread by
  ``--device-spread`` and each scan's time per case by ``--time-noise`` (lognormal sigmas): how many slow devices
  the fleet policy's slow rule finds within 7 days, and how many healthy ones it wrongly flags over ``--days``.
  It runs alone: ``--scenarios slow`` (with ``--devices 2000`` a few minutes).

Printed per policy: share of defective devices quarantined, of those with p >= 1e-3 quarantined within 7 days,
median days to quarantine, healthy devices wrongly quarantined, what the circuit breaker did, and the batch.
Goals for the default policy: >= 99% of devices with p >= 1e-3 quarantined within 7 days, <= 1 healthy device in
10,000 wrongly quarantined over 30 days, nobody for a bad golden file; and the shared-defect batch quarantined.

    python benchmarks/fleet_policy.py --devices 2000 --days 14 --policies default   # a few minutes
    python benchmarks/fleet_policy.py                 # 10,000 devices, 30 days: about 15 minutes per policy
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet_scan.options import DEFAULT_BUDGET_S  # noqa: E402
from fleet_scan.sim import DEFAULT_CASES, SimFleet, SimRun  # noqa: E402
from sdcguard.fleet.policy import QuarantinePolicy  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402

POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "any-failure": {"rate_threshold": 0.0},
    "sticky-only": {"rate_threshold": 1.0 - 1e-12},
    "threshold-1e-3": {"rate_threshold": 1e-3},
}
"""``any-failure``: quarantine on any failed execution (rate_low > 0). ``sticky-only``: never on rate alone.
``threshold-1e-3``: the first default rate threshold, kept to show why the default moved to 1e-4."""


def _summary(run: SimRun, bad_day: int | None) -> dict[str, Any]:
    ids, p, quarantined_on, log = run.ids, run.p, run.quarantined_on, run.log
    batch = {ids[n] for n in run.batch}
    defective = [d for d, pi in zip(ids, p) if pi > 0]
    strong = [d for d, pi in zip(ids, p) if pi >= 1e-3]
    healthy = [d for d, pi in zip(ids, p) if pi == 0 and d not in batch]
    days_to = [quarantined_on[d] + 1 for d in defective if d in quarantined_on]
    within7 = [d for d in strong if d in quarantined_on and quarantined_on[d] + 1 <= 7]
    day = {d.day: d for d in log}
    return {
        "days": len(log),
        "defective": len(defective),
        "defective_quarantined": sum(d in quarantined_on for d in defective),
        "strong": len(strong),
        "strong_within_7_days": len(within7),
        "median_days_to_quarantine": statistics.median(days_to) if days_to else None,
        "healthy": len(healthy),
        "healthy_quarantined": sum(d in quarantined_on for d in healthy),
        "by_node": sum(len(d.by_node) for d in log),
        "missed": [
            f"{x:.1e}" for x in sorted((p[int(d[4:])] for d in defective if d not in quarantined_on), reverse=True)
        ],
        "breaker_days": [d.day for d in log if d.breaker_tripped],
        "bad_day_quarantined": len(day[bad_day].quarantined) if bad_day in day else None,
        "bad_day_reason": (day[bad_day].reasons or [""])[0] if bad_day in day else None,
        "day_after_quarantined": (
            len(day[bad_day + 1].quarantined) if bad_day is not None and bad_day + 1 in day else None
        ),
        "healthy_quarantined_after_bad_day": sum(
            1 for d in healthy if d in quarantined_on and bad_day is not None and quarantined_on[d] >= bad_day
        ),
        "batch": len(batch),
        "batch_quarantined": sum(d in quarantined_on for d in batch),
        "batch_days": sorted(quarantined_on[d] + 1 for d in batch if d in quarantined_on),
        "executions_per_device_day": log[0].executions / len(ids) if log else 0,
    }


def _slow_summary(run: SimRun) -> dict[str, Any]:
    """The slow rule's figures: slow devices found (within 7 days, and the factors of those missed), healthy devices
    flagged (every device that is neither slow nor defective nor of the batch)."""
    slow = {run.ids[n]: float(run.speeds[n]) for n in run.slow}
    quarantined = set(run.quarantined_on)
    healthy = [d for n, d in enumerate(run.ids) if n not in run.slow and run.p[n] == 0 and n not in run.batch]
    return {
        "slow": len(slow),
        "slow_found": sum(d in run.slow_on for d in slow),
        "slow_within_7_days": sum(d in run.slow_on and run.slow_on[d] + 1 <= 7 for d in slow),
        "slow_missed": [f"{slow[d]:.2f}" for d in sorted(slow, key=slow.__getitem__) if d not in run.slow_on],
        "slow_days": sorted(run.slow_on[d] + 1 for d in slow if d in run.slow_on),
        "healthy_flagged_slow": sum(d in run.slow_on for d in healthy),
        "healthy_not_slow": len(healthy),
        "healthy_flagged_speeds": [f"{float(run.speeds[int(d[4:])]):.2f}" for d in healthy if d in run.slow_on][:10],
        "slow_quarantined": sum(d in quarantined for d in slow),
    }


def _run(args: tuple[str, str, dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    scenario, name, overrides, opts = args
    fleet = SimFleet(
        devices=opts["bad_devices"] if scenario == "bad" else opts["devices"],
        defective_share=opts["defective_share"],
        seed=opts["seed"],
        transient_rate=opts["transient_rate"],
        p_low=opts["p_low"],
        p_high=opts["p_high"],
        shared_defect_devices=opts["shared_devices"] if scenario == "shared" else 0,
        shared_defect_p=opts["shared_p"],
        **(
            {
                "slow_devices": opts["slow_devices"],
                "slow_low": opts["slow_low"],
                "slow_high": opts["slow_high"],
                "device_spread": opts["device_spread"],
                "time_noise": opts["time_noise"],
            }
            if scenario == "slow"
            else {}
        ),
    )
    policy = QuarantinePolicy(**overrides)
    bad_day = opts["bad_day"]
    days = {
        "clean": opts["days"],
        "bad": min(opts["days"], bad_day + 3),
        "shared": opts["shared_days"],
        "slow": opts["days"],
    }[scenario]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=opts["tmp"]) as tmp:
        run = SimRun(Path(tmp), fleet, policy, budget_s=opts["budget"])
        bad_case = run.cases[len(run.cases) // 2].id
        for day in range(days):
            run.day(day, bad_case=bad_case if scenario == "bad" and day == bad_day else None)
        with Store.open(run.fleet_store, create=False) as store:
            rows, scans = store.maintenance.row_count("results"), store.maintenance.row_count("scans")
        out = {
            "scenario": scenario,
            "policy": name,
            "overrides": overrides,
            "devices": fleet.devices,
            **_summary(run, bad_day if scenario == "bad" else None),
            **_slow_summary(run),
            "result_rows": rows,
            "scans": scans,
            "fleet_store_mb": run.fleet_store.stat().st_size / 1e6,
        }
    out["seconds"] = time.perf_counter() - t0
    return out


def _pct(a: int, b: int) -> str:
    if not b:
        return "n/a"
    pct = 100.0 * a / b
    return f"{a}/{b} ({pct:.0f}%)" if pct >= 1 or pct == 0 else f"{a}/{b} ({pct:.2f}%)"


def _print(args: argparse.Namespace, out: list[dict[str, Any]], wall: float) -> None:
    first = out[0]
    print(
        f"\nfleet: {args.devices} devices on hosts of 8 (one node store each), {args.defective_share:g} defective "
        f"(p log-uniform {args.p_low:g}..{args.p_high:g}), transient rate {args.transient_rate:g}/execution on "
        f"every device, daily scans of {args.budget:g} s ({first['executions_per_device_day']:.0f} executions per "
        f"device-day over {len(DEFAULT_CASES)} cases), node policy in each node store, merge, fleet policy\n"
    )
    clean = [r for r in out if r["scenario"] == "clean"]
    if clean:
        print(f"Clean month ({args.days} days):\n")
        print(
            "| policy | defective quarantined | p >= 1e-3 within 7 days | median days to quarantine | "
            "healthy wrongly quarantined | by a node policy |"
        )
        print("|---|---|---|---|---|---|")
        for r in clean:
            print(
                f"| {r['policy']} | {_pct(r['defective_quarantined'], r['defective'])} | "
                f"{_pct(r['strong_within_7_days'], r['strong'])} | {r['median_days_to_quarantine']} | "
                f"{_pct(r['healthy_quarantined'], r['healthy'])} | {r['by_node']} |"
            )
        print()
    bad = [r for r in out if r["scenario"] == "bad"]
    if bad:
        print(
            f"Bad golden file on day {args.bad_day}, rolled back the next day; {args.bad_devices or args.devices} "
            f"devices, days 0..{args.bad_day + 2}:\n"
        )
        print(
            f"| policy | breaker on day {args.bad_day} | quarantined on day {args.bad_day} | quarantined on day "
            f"{args.bad_day + 1} | healthy quarantined after day {args.bad_day} | other breaker days |"
        )
        print("|---|---|---|---|---|---|")
        for r in bad:
            other = [d for d in r["breaker_days"] if d != args.bad_day]
            print(
                f"| {r['policy']} | {'tripped' if args.bad_day in r['breaker_days'] else 'did not trip'} | "
                f"{r['bad_day_quarantined']} | {r['day_after_quarantined']} | "
                f"{r['healthy_quarantined_after_bad_day']} | {other or 'none'} |"
            )
        reason = next((r["bad_day_reason"] for r in bad if r["bad_day_reason"]), "")
        print(f"\nday {args.bad_day} breaker reason: {reason}\n")
    shared = [r for r in out if r["scenario"] == "shared"]
    if shared:
        print(
            f"A batch of {args.shared_devices} devices sharing one defect (one case, the same wrong output, "
            f"p = {args.shared_p:g} per execution of that case), {args.shared_days} days:\n"
        )
        print("| policy | batch quarantined | on days | breaker days | healthy wrongly quarantined |")
        print("|---|---|---|---|---|")
        for r in shared:
            print(
                f"| {r['policy']} | {_pct(r['batch_quarantined'], r['batch'])} | {r['batch_days']} | "
                f"{r['breaker_days'] or 'none'} | {_pct(r['healthy_quarantined'], r['healthy'])} |"
            )
        print()
    slow = [r for r in out if r["scenario"] == "slow"]
    if slow:
        print(
            f"Slow devices: {args.slow_devices} of {args.devices} slower than their peers (log-uniform "
            f"{args.slow_low:g}..{args.slow_high:g}x), every device's lasting speed spread {args.device_spread:g} "
            f"and each scan's time per case {args.time_noise:g} (lognormal sigmas), {args.days} days:\n"
        )
        print(
            "| policy | slow found within 7 days | slow found | days found | slowdowns missed | healthy wrongly "
            f"flagged ({args.days} days) | slow quarantined |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in slow:
            print(
                f"| {r['policy']} | {_pct(r['slow_within_7_days'], r['slow'])} | {_pct(r['slow_found'], r['slow'])} "
                f"| {sorted(set(r['slow_days']))} | {', '.join(r['slow_missed']) or 'none'} | "
                f"{_pct(r['healthy_flagged_slow'], r['healthy_not_slow'])} | {r['slow_quarantined']} |"
            )
        print()
    for r in out:
        print(
            f"{r['scenario']}/{r['policy']}: missed defective p = {', '.join(r['missed']) or 'none'}; "
            f"{r['result_rows']:,} result rows for {r['scans']:,} scans ({r['fleet_store_mb']:.0f} MB fleet store), "
            f"{r['seconds']:.0f} s"
        )
    print(f"\nwall time {wall:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--defective-share", type=float, default=1e-3)
    ap.add_argument("--transient-rate", type=float, default=1e-8)
    ap.add_argument("--p-low", type=float, default=1e-5, help="lowest failure probability of a defective device")
    ap.add_argument("--p-high", type=float, default=1e-1, help="highest failure probability of a defective device")
    ap.add_argument("--policies", default=None, help="comma-separated subset of the policies to run")
    ap.add_argument("--scenarios", default="clean,bad,shared", help="any of clean, bad, shared, slow")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S)
    ap.add_argument("--bad-day", type=int, default=10)
    ap.add_argument(
        "--bad-devices", type=int, default=None, help="fleet size of the bad-golden scenario (default: --devices)"
    )
    ap.add_argument("--shared-devices", type=int, default=20, help="devices of the batch sharing one defect")
    ap.add_argument(
        "--shared-p",
        type=float,
        default=0.05,
        help="probability that the shared defect corrupts one execution of its case",
    )
    ap.add_argument("--shared-days", type=int, default=7)
    ap.add_argument("--slow-devices", type=int, default=20, help="slow scenario: devices slower than their peers")
    ap.add_argument("--slow-low", type=float, default=1.25, help="slow scenario: the least slowdown")
    ap.add_argument("--slow-high", type=float, default=3.0, help="slow scenario: the largest slowdown")
    ap.add_argument(
        "--device-spread",
        type=float,
        default=0.03,
        help="slow scenario: lognormal sigma of every device's own lasting speed",
    )
    ap.add_argument(
        "--time-noise",
        type=float,
        default=0.05,
        help="slow scenario: lognormal sigma of each scan's measured time per case",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:JSON",
        help="an extra policy, e.g. 'low-threshold:{\"rate_threshold\": 1e-4}'",
    )
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    policies = dict(POLICIES)
    for v in args.variant:
        name, _, text = v.partition(":")
        policies[name] = json.loads(text)
    if args.policies:
        policies = {k: v for k, v in policies.items() if k in args.policies.split(",")}
    scenarios = args.scenarios.split(",")
    tmp = "/dev/shm" if os.path.isdir("/dev/shm") else None
    opts = {
        "devices": args.devices,
        "defective_share": args.defective_share,
        "seed": args.seed,
        "days": args.days,
        "budget": args.budget,
        "transient_rate": args.transient_rate,
        "tmp": tmp,
        "bad_day": args.bad_day,
        "p_low": args.p_low,
        "p_high": args.p_high,
        "bad_devices": args.bad_devices or args.devices,
        "shared_devices": args.shared_devices,
        "shared_p": args.shared_p,
        "shared_days": args.shared_days,
        "slow_devices": args.slow_devices,
        "slow_low": args.slow_low,
        "slow_high": args.slow_high,
        "device_spread": args.device_spread,
        "time_noise": args.time_noise,
    }
    order = ["clean", "bad", "shared", "slow"]
    jobs = [(s, name, o, opts) for s in order if s in scenarios for name, o in policies.items()]
    t0 = time.perf_counter()
    out = []
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for r in pool.imap_unordered(_run, jobs):  # jobs report as they finish: a partial run still gives lines
            out.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "overrides"}), flush=True)
            if args.json:
                args.json.write_text(json.dumps(out, indent=2))
    out.sort(key=lambda r: (order.index(r["scenario"]), list(policies).index(r["policy"])))
    _print(args, out, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
