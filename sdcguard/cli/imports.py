"""``sdcguard import dcgm FILE``: DCGM's diagnostics as a second opinion on each GPU."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import click

from ..errors import BadInput
from ..fleet.dcgm import DiagRun, parse_diag
from ..fleet.store.rows import DiagRecord
from .common import device_id, open_store

__all__ = ["import_group"]


@click.group("import")
def import_group() -> None:
    """Record other tools' findings per device, beside the golden suite's."""


Known = list[tuple[str, str, int | None, str | None]]
"""The store's devices: (id, host, index, serial)."""


def _devices(run: DiagRun, known: Known, host: str, named: dict[int, str]) -> dict[int, str]:
    """GPU index -> device id: ``--gpu`` where given, else the store's GPU of ``host`` with that serial, else with
    that index; one line naming the first GPU it cannot place."""
    serial_of = {r.index: r.serial for r in run.results}
    out: dict[int, str] = {}
    for i in run.indices:
        if i in named:
            out[i] = named[i]
            continue
        here = [(d, idx, serial) for d, h, idx, serial in known if h == host and d.startswith("GPU-")]
        by_serial = [d for d, _, serial in here if serial_of[i] and serial == serial_of[i]]
        by_index = [d for d, idx, _ in here if idx == i]
        match = by_serial or by_index
        if len(match) != 1:
            raise BadInput(
                f"the diagnostic names GPU {i} on {host}, which the store "
                + ("knows twice" if match else "does not know")
                + f": scan {host} first (sdcguard scan records its GPUs), or name it with --gpu {i}=GPU-<uuid>"
            )
        out[i] = match[0]
    return out


@import_group.command("dcgm")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--host", default=None, help="The host the diagnostic ran on (default: this one).")
@click.option("--gpu", "gpus", multiple=True, metavar="INDEX=DEVICE", help="Name a GPU index's device id.")
def dcgm(file: Path, host: str | None, gpus: tuple[str, ...]) -> None:
    """Record a `dcgmi diag -j` output (DCGM 3.x or 4.x, levels 1-4) per GPU, beside the golden suite's results:
    `sdcguard report` shows each device's latest diagnostic. Its GPUs are the store's by serial, else by index on
    --host. Bad or foreign JSON: one line, exit 2, nothing written.

    Example: dcgmi diag -r 3 -j > diag.json && sdcguard import dcgm diag.json
    """
    from ..devices import hostname

    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{file}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    run = parse_diag(text)
    named: dict[int, str] = {}
    for g in gpus:
        index, _, device = g.partition("=")
        if not index.strip().isdigit() or not device.strip():
            raise BadInput(f"--gpu {g!r}: use INDEX=DEVICE, e.g. --gpu 3=GPU-<uuid>")
        named[int(index)] = device_id(device)
    where = host or hostname()
    with open_store(create=True) as store:
        known = [(d.id, d.host, d.index, d.serial) for d in store.scans.devices()]
        devices = _devices(run, known, where, named)
        records = [
            DiagRecord(
                device=devices[r.index],
                category=r.category,
                test=r.test,
                status=r.status,
                warnings=tuple(w.text for w in r.warnings),
            )
            for r in run.results
        ]
        stat = os.stat(file)
        run_id = hashlib.sha256(text.encode()).hexdigest()[:16]
        written = store.diagnostics.record(
            records,
            host=where,
            time=stat.st_mtime or time.time(),
            run_id=run_id,
            dcgm_version=run.dcgm_version,
            driver=run.driver,
        )
    failed = sorted({f"{devices[r.index]} {r.test}" for r in run.results if r.status == "fail"})
    click.echo(
        f"{file}: {len(run.results)} results of {len(devices)} GPU(s) on {where}, {written} new"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
