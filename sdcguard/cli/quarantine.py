"""``sdcguard quarantine list|add|release|history``: the devices out of service, by hand and by policy."""

from __future__ import annotations

import json

import click

from ..devices import device_kind, unknown_device
from ..durations import DEFAULT_WINDOW, iso_utc
from ..errors import BadInput
from .common import device_id, format_option, open_store, print_table, status_text

__all__ = ["quarantine"]


@click.group("quarantine")
def quarantine() -> None:
    """Devices out of service: list them, add one by hand, release one (it goes on probation), see the history
    and the policy's decisions.

    Example: sdcguard quarantine release GPU-... --reason "replaced the board"
    """


@quarantine.command("list")
@format_option("table", "json")
def list_(fmt: str) -> None:
    """Devices quarantined or on probation.

    Example: sdcguard quarantine list --format json
    """
    with open_store(readonly=True) as store:
        entries = store.quarantine.entries()
    if fmt == "json":
        click.echo(
            json.dumps(
                [
                    {
                        "device": e.device,
                        "host": e.host,
                        "state": e.state,
                        "since": iso_utc(e.since),
                        "reason": e.reason,
                        "by": e.by,
                    }
                    for e in entries
                ],
                indent=1,
            )
        )
        return
    print_table(
        "quarantine",
        ["device", "host", "state", "since (UTC)", "by", "reason"],
        [[e.device, e.host or "-", status_text(e.state), iso_utc(e.since) or "", e.by, e.reason] for e in entries],
        caption=None if entries else "no device is quarantined or on probation",
    )


@quarantine.command("add")
@click.argument("device")
@click.option("--reason", required=True, help="Why (kept in the history).")
@click.option(
    "--new",
    "new",
    is_flag=True,
    help="DEVICE was never scanned here: record it and quarantine it (otherwise an unknown id is refused, "
    "so a typo quarantines nothing).",
)
def add(device: str, reason: str, new: bool) -> None:
    """Quarantine DEVICE by hand.

    Example: sdcguard quarantine add cpu:node7:3 --reason "MCE errors in dmesg"
    """
    device = device_id(device)
    try:
        device_kind(device)
    except BadInput as e:
        raise BadInput(f"cannot quarantine {device!r}: {e}") from None
    with open_store(create=new) as store:
        if not new and store.scans.device(device) is None:
            raise unknown_device(
                device,
                [d.id for d in store.scans.devices()],
                what=f"cannot quarantine {device}",
                hint="; pass --new to quarantine a device no scan has recorded yet",
            )
        store.quarantine.add(device, reason=reason, new=new)
    click.echo(f"{device} quarantined")


@quarantine.command("release")
@click.argument("device")
@click.option("--reason", required=True, help="Why (kept in the history).")
def release(device: str, reason: str) -> None:
    """Release a quarantined DEVICE: it goes on probation until enough clean scans.

    Example: sdcguard quarantine release GPU-... --reason "board replaced"
    """
    device = device_id(device)
    with open_store() as store:
        if store.scans.device(device) is None:
            raise unknown_device(
                device,
                [d.id for d in store.scans.devices()],
                what=f"cannot release {device}",
                hint="; `sdcguard quarantine list` shows the quarantined devices",
            )
        store.quarantine.release(device, reason=reason)
    click.echo(f"{device} released: on probation until enough clean scans")


@quarantine.command("history")
@click.argument("device", required=False)
@format_option("table", "json")
def history(device: str | None, fmt: str) -> None:
    """Every quarantine change: who, when, why (of DEVICE, or of all devices).

    Example: sdcguard quarantine history cpu:node7:3
    """
    with open_store(readonly=True) as store:
        wanted = device_id(device) if device else None
        rows = store.quarantine.history(wanted)
        if wanted is not None and not rows and store.scans.device(wanted) is None:
            raise unknown_device(wanted, [d.id for d in store.scans.devices()], what="no quarantine history")
    if fmt == "json":
        click.echo(json.dumps([{**r, "time": iso_utc(r["time"])} for r in rows], indent=1))
        return
    print_table(
        "quarantine history",
        ["time (UTC)", "device", "action", "by", "reason"],
        [[iso_utc(r["time"]) or "", r["device"], r["action"], r["by"], r["reason"]] for r in rows],
    )


@quarantine.command("decisions")
@click.option("--since", default=DEFAULT_WINDOW, show_default=True, help="Window: a duration (12h, 7d, 2w) or 'all'.")
@format_option("table", "json")
def decisions(since: str, fmt: str) -> None:
    """What the policy decided and why: quarantines, circuit-breaker trips, probations passed, actions.

    Example: sdcguard quarantine decisions --since 1d
    """
    from ..durations import since_timestamp

    start = since_timestamp(since)
    with open_store(readonly=True) as store:
        rows = store.quarantine.decisions(since=start)
    if fmt == "json":
        click.echo(
            json.dumps(
                [
                    {"time": iso_utc(r.time), "device": r.device, "decision": r.decision, "reason": r.reason}
                    for r in rows
                ],
                indent=1,
            )
        )
        return
    print_table(
        "policy decisions",
        ["time (UTC)", "device", "decision", "reason"],
        [[iso_utc(r.time) or "", r.device or "(fleet)", r.decision, r.reason] for r in rows],
        caption=None if rows else "no policy decision in the window",
    )
