"""``sdcguard plan``: a job's checkpoint interval and check cadence from the devices it will run on."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import click

from ..durations import parse_seconds, since_timestamp
from ..errors import BadInput
from ..fleet.plan.advice import Plan, PlanSettings, make_plan
from ..fleet.plan.allocation import Allocation, read_allocation
from .common import device_id, format_option, open_store, print_table

__all__ = ["plan"]


def _devices_of(devices_file: Path | None, hosts: str | None, store_devices: list[tuple[str, str]]) -> list[str]:
    if (devices_file is None) == (hosts is None):
        raise BadInput("give the allocation once: --devices FILE (one device id per line) or --hosts LIST")
    if devices_file is not None:
        try:
            text = devices_file.read_text()
        except OSError as e:
            raise BadInput(f"--devices {devices_file}: cannot read it ({e.strerror or e})") from None
        return [device_id(line.split("#", 1)[0]) for line in text.splitlines() if line.split("#", 1)[0].strip()]
    assert hosts is not None
    wanted = [h.strip() for h in hosts.split(",") if h.strip()]
    found = [d for d, host in store_devices if host in wanted]
    missing = [h for h in wanted if not any(host == h for _, host in store_devices)]
    if missing:
        raise BadInput(f"--hosts: the store knows no device on {', '.join(missing)}")
    return found


def _hours(s: float) -> str:
    return "unbounded" if not math.isfinite(s) else f"{s / 3600:.2f} h"


def _table(allocation: Allocation, p: Plan) -> None:
    low, high = p.sdc_range_per_day
    rows = [
        ["devices", str(p.devices)],
        ["SDC events per day", f"{p.sdc_per_day:.3g} (bounds {low:.3g}..{high:.3g})"],
        ["loud interruptions per day", f"{p.loud_per_day:.3g}"],
        ["mean time between interruptions", _hours(p.mtbf_s)],
        ["checkpoint interval, Young", _hours(p.young_s)],
        ["checkpoint interval, Daly", _hours(p.daly_s)],
        [
            "with in-memory recovery (Daly, loud only)",
            "needs --mtbf" if p.recover_interval_s is None else _hours(p.recover_interval_s),
        ],
        ["replay_every", str(p.cadence.replay_every)],
        ["checksum_every", str(p.cadence.checksum_every) + ("" if p.cadence.checksum_every else " (off)")],
        ["the checks' overhead", f"{p.cadence.overhead:.1%} of a step"],
        ["steps to a sticky fault's detection", f"{p.cadence.sticky_mean_steps:.1f} on average"],
        ["goodput, restart from checkpoint", f"{p.goodput_restart:.1%}"],
        ["goodput, in-memory recovery", f"{p.goodput_recover:.1%}"],
    ]
    print_table("plan", ["", ""], rows)
    lemons = allocation.lemons()
    if lemons:
        print_table(
            "devices worse than the fleet (lower bound above its rate)",
            ["device", "events", "test hours", "per hour", "lower bound", "status"],
            [
                [d.device, str(d.events), f"{d.hours:.2f}", f"{d.per_hour:.3g}", f"{d.low_per_hour:.3g}", d.status]
                for d in lemons
            ],
        )
    for line in ([p.cadence_note] if p.cadence_note else []) + list(p.warnings):
        click.echo(f"warning: {line}", err=True)


@click.command("plan")
@click.option("--devices", "devices_file", type=click.Path(path_type=Path), help="A file of device ids, one a line.")
@click.option("--hosts", default=None, help="The allocation's hosts, comma-separated: every device the store knows.")
@click.option("--step-time", "step_time", required=True, help="One training step (e.g. 1.2s).")
@click.option("--checkpoint-cost", "checkpoint_cost", required=True, help="The time a checkpoint blocks (e.g. 40s).")
@click.option("--restart-cost", "restart_cost", default="10m", show_default=True, help="Interruption to training.")
@click.option("--recovery-cost", "recovery_cost", default="30s", show_default=True, help="An in-memory recovery.")
@click.option("--mtbf", default=None, help="Mean time between loud interruptions of the allocation (e.g. 12h).")
@click.option("--max-unverified-steps", type=int, default=49, show_default=True, help="Steps between samples.")
@click.option("--max-overhead", type=float, default=0.05, show_default=True, help="The checks' share of a step.")
@click.option("--since", default="30d", show_default=True, help="The evidence window (a duration, or 'all').")
@format_option("table", "json", "env")
def plan(
    devices_file: Path | None,
    hosts: str | None,
    step_time: str,
    checkpoint_cost: str,
    restart_cost: str,
    recovery_cost: str,
    mtbf: str | None,
    max_unverified_steps: int,
    max_overhead: float,
    since: str,
    fmt: str,
) -> None:
    """The checkpoint interval, replay_every and checksum_every for a job on these devices, from their SDC rates.

    Example: sdcguard plan --hosts node1,node2 --step-time 1.2s --checkpoint-cost 40s --mtbf 12h --format env
    """
    settings = PlanSettings(
        step_s=parse_seconds(step_time, option="--step-time"),
        checkpoint_s=parse_seconds(checkpoint_cost, option="--checkpoint-cost"),
        restart_s=parse_seconds(restart_cost, option="--restart-cost", zero=True),
        recovery_s=parse_seconds(recovery_cost, option="--recovery-cost", zero=True),
        mtbf_s=None if mtbf is None else parse_seconds(mtbf, option="--mtbf"),
        max_unverified_steps=max_unverified_steps,
        max_overhead=max_overhead,
    )
    start = since_timestamp(since, default="30d")
    with open_store(readonly=True) as store:
        devices = _devices_of(devices_file, hosts, [(d.id, d.host) for d in store.scans.devices()])
        allocation = read_allocation(store, devices, since=start if start is not None else float("-inf"))
    p = make_plan(allocation, settings)
    if fmt == "env":
        interval = p.recover_interval_s if p.recover_interval_s is not None else p.daly_s
        click.echo(
            f"SDCGUARD_REPLAY_EVERY={p.cadence.replay_every} SDCGUARD_CHECKSUM_EVERY={p.cadence.checksum_every} "
            f"CHECKPOINT_INTERVAL_S={'inf' if not math.isfinite(interval) else round(interval)}"
        )
        return
    if fmt == "json":
        body = asdict(p)
        body["lemons"] = [asdict(d) for d in allocation.lemons()]
        body["allocation"] = [asdict(d) for d in allocation.devices]
        click.echo(json.dumps(body, indent=1, default=str))
        return
    _table(allocation, p)
