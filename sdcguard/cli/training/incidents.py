"""``sdcguard incidents``: corrupted training steps the guard recorded."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ...devices import unknown_device
from ...durations import iso_utc, since_timestamp
from ..common import device_id, format_option, open_store, print_table

__all__ = ["incidents"]


@click.command("incidents")
@click.option("--since", default="all", show_default=True, help="Window: a duration (12h, 7d, 2w) or 'all'.")
@click.option("--device", default=None, help="Only incidents naming this device.")
@format_option("table", "json")
def incidents(since: str, device: str | None, fmt: str) -> None:
    """Training incidents: which check fired, at which step, on which rank, device and host.

    Example: sdcguard incidents --since 7d --format json
    """
    start = since_timestamp(since, default="all")
    with open_store(readonly=True) as store:
        if device is not None:
            device = device_id(device)
            if store.scans.device(device) is None:
                raise unknown_device(device, [d.id for d in store.scans.devices()], what="no incidents to show")
        found = store.training.incidents(since=start, device=device)
    if fmt == "json":
        click.echo(json.dumps([{**asdict(i), "time": iso_utc(i.time)} for i in found], indent=1))
        return
    print_table(
        "incidents",
        ["time (UTC)", "kind", "step", "ranks", "devices", "hosts", "job", "roll back to", "detail"],
        [
            [
                iso_utc(i.time) or "",
                i.kind,
                i.steps(),
                ",".join(map(str, i.suspect_ranks)),
                ",".join(i.devices or ((i.device,) if i.device else ())),
                ",".join(i.hosts),
                i.job or "-",
                i.roll_back_to(),
                i.detail,
            ]
            for i in found
        ],
        caption=None if found else "no incident recorded",
    )
