"""The quarantine policy on a simulated fleet: 10,000 devices scanned daily for 30 days, through the real store.

One device in 1,000 is defective, with a per-execution failure probability log-uniform in [1e-5, 1e-1]; every
device (healthy ones too) has a rare transient rate. Each day every device not quarantined gets a scan with the
scanner's default budget (``fleet_scan.sim``), then the policy runs. On day 10 a bad golden file is rolled out
(every device fails one case with the same wrong output); it is rolled back the next day.

Printed, for the default policy and two naive ones (and any variant given with --variant):
share of defective devices quarantined, of those with p >= 1e-3 quarantined within 7 days, median days to
quarantine, healthy devices wrongly quarantined, what the circuit breaker did on day 10 and what followed on day 11.
Goals for the default policy: >= 99% of defective devices with p >= 1e-3 quarantined within 7 days, <= 1 healthy
device in 10,000 wrongly quarantined over 30 days.

    python benchmarks/fleet_policy.py                 # the full fleet (about 10 minutes per policy and core)
    python benchmarks/fleet_policy.py --devices 2000 --defective-share 0.01 --days 14   # quicker
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
from sdcguard.fleet.store import Store  # noqa: E402

POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "any-failure": {"rate_threshold": 0.0},
    "sticky-only": {"rate_threshold": 1.0 - 1e-12},
    "threshold-1e-3": {"rate_threshold": 1e-3},
}
"""``any-failure``: quarantine on any failed execution (rate_low > 0). ``sticky-only``: never on rate alone.
``threshold-1e-3``: the first default rate threshold, kept to show why the default moved to 1e-4."""


def _summary(name: str, overrides: dict[str, Any], run: SimRun, bad_day: int | None, rows: int) -> dict[str, Any]:
    ids, p, quarantined_on, log = run.ids, run.p, run.quarantined_on, run.log
    defective = [d for d, pi in zip(ids, p) if pi > 0]
    strong = [d for d, pi in zip(ids, p) if pi >= 1e-3]
    healthy = [d for d, pi in zip(ids, p) if pi == 0]
    days_to = [quarantined_on[d] + 1 for d in defective if d in quarantined_on]
    within7 = [d for d in strong if d in quarantined_on and quarantined_on[d] + 1 <= 7]
    day = {d.day: d for d in log}
    return {
        "policy": name,
        "overrides": overrides,
        "bad_day": bad_day,
        "days": len(log),
        "defective": len(defective),
        "defective_quarantined": sum(d in quarantined_on for d in defective),
        "strong": len(strong),
        "strong_within_7_days": len(within7),
        "median_days_to_quarantine": statistics.median(days_to) if days_to else None,
        "healthy": len(healthy),
        "healthy_quarantined": sum(d in quarantined_on for d in healthy),
        "missed": [f"{x:.1e}" for x in sorted((p[int(d[4:])] for d in defective if d not in quarantined_on),
                                               reverse=True)],
        "breaker_days": [d.day for d in log if d.breaker_tripped],
        "bad_day_quarantined": len(day[bad_day].quarantined) if bad_day in day else None,
        "bad_day_reason": (day[bad_day].reasons or [""])[0] if bad_day in day else None,
        "day_after_quarantined": len(day[bad_day + 1].quarantined) if bad_day is not None and bad_day + 1 in day else None,
        "healthy_quarantined_after_bad_day": sum(
            1 for d in healthy if d in quarantined_on and bad_day is not None and quarantined_on[d] >= bad_day),
        "executions_per_device_day": log[0].executions / len(ids) if log else 0,
        "result_rows": rows,
    }


def _rows(path: Path) -> int:
    with Store.open(path) as store:
        return int(store.scalar("SELECT COUNT(*) FROM results"))


def _run(args: tuple[str, str, dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """One policy in one scenario: ``clean`` (the whole month) or ``bad`` (the bad golden file on its day)."""
    scenario, name, overrides, opts = args
    devices = opts["devices"] if scenario == "clean" else opts["bad_devices"]
    fleet = SimFleet(devices=devices, defective_share=opts["defective_share"], seed=opts["seed"],
                     transient_rate=opts["transient_rate"], p_low=opts["p_low"], p_high=opts["p_high"])
    policy = QuarantinePolicy(**overrides)
    bad_day, days = opts["bad_day"], opts["days"]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=opts["tmp"]) as tmp:
        run = SimRun(Path(tmp) / "fleet.db", fleet, policy, budget_s=opts["budget"])
        if scenario == "clean":
            for day in range(days):
                run.day(day)
        else:  # the same history up to the bad day, then the bad file for one day and two days after it
            bad_case = run.cases[len(run.cases) // 2].id
            for day in range(min(days, bad_day + 3)):
                run.day(day, bad_case=bad_case if day == bad_day else None)
        run.close()
        out = _summary(name, overrides, run, None if scenario == "clean" else bad_day, _rows(run.store_path))
    out["scenario"] = scenario
    out["seconds"] = time.perf_counter() - t0
    return out


def _pct(a: int, b: int) -> str:
    if not b:
        return "n/a"
    pct = 100.0 * a / b
    return f"{a}/{b} ({pct:.0f}%)" if pct >= 1 or pct == 0 else f"{a}/{b} ({pct:.2f}%)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--defective-share", type=float, default=1e-3)
    ap.add_argument("--transient-rate", type=float, default=1e-8)
    ap.add_argument("--p-low", type=float, default=1e-5, help="lowest failure probability of a defective device")
    ap.add_argument("--p-high", type=float, default=1e-1, help="highest failure probability of a defective device")
    ap.add_argument("--policies", default=None, help="comma-separated subset of the policies to run")
    ap.add_argument("--scenarios", default="clean,bad", help="clean, bad or both (default)")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S)
    ap.add_argument("--bad-day", type=int, default=10)
    ap.add_argument("--bad-devices", type=int, default=None,
                    help="fleet size of the bad-golden scenario (default: --devices)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:JSON",
                    help='an extra policy, e.g. \'low-threshold:{"rate_threshold": 1e-4}\'')
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
    opts = {"devices": args.devices, "defective_share": args.defective_share, "seed": args.seed, "days": args.days,
            "budget": args.budget, "transient_rate": args.transient_rate, "tmp": tmp, "bad_day": args.bad_day, "p_low": args.p_low, "p_high": args.p_high,
            "bad_devices": args.bad_devices or args.devices}
    # Each policy twice: a clean month (the detection and false-quarantine goals), and the same month with the
    # bad golden file on --bad-day (the circuit breaker, and what the policy does once the breaker's window ends).
    # Each policy twice: a clean month (the detection and false-quarantine goals), and the same fleet with the bad
    # golden file on --bad-day (the circuit breaker, and what the policy does once the breaker's window ends).
    # Jobs report as they finish (a partial run still gives its lines).
    jobs = [("clean", name, o, opts) for name, o in policies.items() if name in ("default", "threshold-1e-3")]
    jobs += [("bad", name, o, opts) for name, o in policies.items()]
    jobs += [("clean", name, o, opts) for name, o in policies.items() if name not in ("default", "threshold-1e-3")]
    jobs = [j for j in jobs if j[0] in scenarios]
    t0 = time.perf_counter()
    out = []
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for r in pool.imap_unordered(_run, jobs):
            out.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "overrides"}), flush=True)
            if args.json:
                args.json.write_text(json.dumps(out, indent=2))
    wall = time.perf_counter() - t0
    print()
    clean = {r["policy"]: r for r in out if r["scenario"] == "clean"}
    bad = {r["policy"]: r for r in out if r["scenario"] == "bad"}
    first = out[0]
    print(f"fleet: {args.devices} devices, {args.defective_share:g} defective (p log-uniform "
          f"{args.p_low:g}..{args.p_high:g}), "
          f"transient rate {args.transient_rate:g}/execution on every device, {args.days} daily scans of "
          f"{args.budget:g} s ({first['executions_per_device_day']:.0f} executions per device-day over "
          f"{len(DEFAULT_CASES)} cases)")
    print()
    if clean:
        print(f"Clean month ({args.days} days):")
        print()
        print("| policy | defective quarantined | p >= 1e-3 within 7 days | median days to quarantine | "
              "healthy wrongly quarantined |")
        print("|---|---|---|---|---|")
        for name, r in clean.items():
            print(f"| {name} | {_pct(r['defective_quarantined'], r['defective'])} | "
                  f"{_pct(r['strong_within_7_days'], r['strong'])} | {r['median_days_to_quarantine']} | "
                  f"{_pct(r['healthy_quarantined'], r['healthy'])} |")
        print()
    if bad:
        print(f"Bad golden file rolled out on day {args.bad_day} (every device fails one case with the same "
              f"output), rolled back the next day; {args.bad_devices or args.devices} devices, days "
              f"0..{args.bad_day + 2}:")
        print()
        print(f"| policy | breaker on day {args.bad_day} | quarantined on day {args.bad_day} | quarantined on day "
              f"{args.bad_day + 1} | healthy quarantined after day {args.bad_day} | other breaker days |")
        print("|---|---|---|---|---|---|")
        for name, r in bad.items():
            other = [d for d in r["breaker_days"] if d != args.bad_day]
            print(f"| {name} | {'tripped' if args.bad_day in r['breaker_days'] else 'did not trip'} | "
                  f"{r['bad_day_quarantined']} | {r['day_after_quarantined']} | "
                  f"{r['healthy_quarantined_after_bad_day']} | {other or 'none'} |")
        print()
    for name, r in clean.items():
        print(f"{name}: overrides {r['overrides'] or '(defaults)'}; missed defective p = "
              f"{', '.join(r['missed']) or 'none'}; breaker days in the clean month {r['breaker_days'] or 'none'}; "
              f"{r['result_rows']} result rows, {r['seconds']:.0f} s")
    reason = next((r["bad_day_reason"] for r in bad.values() if r["bad_day_reason"]), "")
    if reason:
        print(f"day {args.bad_day} breaker reason: {reason}")
    print(f"\nwall time {wall:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
