"""``sdcguard report``: per-device SDC rates, bounds and status over a window."""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

# The report does no linear algebra, but importing numpy starts an OpenBLAS thread pool whose threads take CPU from
# the report on a busy machine: 0.1 s of the 1.5 s CLI report of 10,000 devices (measured, benchmarks/report_scale.py).
# Set before numpy is first imported (by the fleet modules below); an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from fleet_scan.config import config_option, drill_store_option, load_config, load_policy  # noqa: E402

from ..durations import DEFAULT_WINDOW, since_timestamp  # noqa: E402
from ..errors import BadInput  # noqa: E402
from ..fleet.report.devices import build_report, report_csv_rows  # noqa: E402
from ..fleet.report.kept import ReportLines, kept_lines  # noqa: E402
from ..fleet.store.rows import DeviceStatus  # noqa: E402
from ..fleet.store.store import Store  # noqa: E402
from .common import (  # noqa: E402
    DEFAULT_SLOW_MAX_AGE,
    confidence_option,
    device_id,
    fmt_float,
    format_option,
    open_store,
    print_table,
    slow_max_age_option,
    slow_max_age_s,
    status_text,
)


def _slow_text(row: dict[str, object]) -> str:
    """The table's ``slow`` cell: ``2.01x SLOW (pair, medium)`` for a slow device, its slowdown otherwise."""
    x = row.get("slowdown")
    figure = "" if not isinstance(x, float) else f"{x:.2f}x"
    if not row.get("slow"):
        return figure
    how = ", ".join(str(v) for v in (row.get("slow_basis"), row.get("slow_confidence")) if v)
    return f"{figure} SLOW ({how})".strip()


__all__ = ["report"]

_TABLE_ALL_UP_TO = 50
"""A table lists every device up to this many; beyond, healthy devices are counted, not listed."""


def _print_report(lines: ReportLines, *, since: str, confidence: float, show_all: bool) -> None:
    """The table: a row per device, its kernel families under it with ``--families``."""
    from ..fleet.report.html_parts import counted  # the table's only: JSON and CSV need none of the page's parts

    counts = lines.counts()
    caption = (
        f"{counted(len(lines), 'device')}, window {since}: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f"; bounds one-sided Clopper-Pearson at {confidence:.0%}"
    )
    listed: tuple[DeviceStatus, ...] | None = None
    if len(lines) > _TABLE_ALL_UP_TO and not show_all:
        # The morning view of a large fleet: what needs attention; the rest is a count (JSON/CSV list all).
        listed = ("quarantined", "probation", "suspect")
        caption += f"; {counts['healthy']} healthy devices not listed (--all lists them)"
    shown = list(lines.dicts(listed))
    dcgm = any(d.get("dcgm") for d in shown)  # a column only where a diagnostic was imported
    nvml = any(d.get("nvml") for d in shown)  # and only where a GPU's scan read NVML's telemetry
    print_table(
        "sdcguard report",
        [
            "device",
            "host",
            "status",
            "slow",
            "executions",
            "failures",
            "rate",
            "rate_low",
            "rate_high",
            "scans",
            "last scan (UTC)",
            *(["dcgm diag"] if dcgm else []),
            *(["nvml"] if nvml else []),
        ],
        [line for d in shown for line in _lines(d, dcgm, nvml)],
        caption=caption,
    )


def _open(drills: bool, drill_store: Path | None) -> Store:
    """The store the report reads: the fleet's, or with ``drills`` its drill store (said on stderr)."""
    if not drills:
        return open_store(readonly=True)
    from ..fleet.store.drills import drill_store_for

    path = drill_store_for(click.get_current_context().find_root().obj.db, drill_store)
    if not Path(path).exists():
        raise BadInput(f"no fire drill recorded: no drill store at {path} (a scan with --inject writes one)")
    click.echo(f"fire drills, from the drill store {path} (never part of the fleet's figures)", err=True)
    return open_store(readonly=True, db=path)


def _lines(d: dict[str, Any], dcgm: bool, nvml: bool) -> list[list[str]]:
    """A device's row (its JSON object), and under it (``--families``) its figures per kernel family; ``dcgm``: with
    the latest DCGM diagnostic's result; ``nvml``: with what NVML saw around its latest scan."""
    return [
        [
            d["device"],
            d["host"],
            status_text(d["status"]),
            _slow_text(d),
            str(d["executions"]),
            str(d["failures"]),
            fmt_float(d["rate"]),
            fmt_float(d["rate_low"]),
            fmt_float(d["rate_high"]),
            str(d["scans"]),
            d["last_scan"] or "never",
            *([d.get("dcgm") or "-"] if dcgm else []),
            *([(d.get("nvml") or {}).get("text") or "-"] if nvml else []),
        ],
        *(  # --families: the device's figures per kernel family, under its row
            [
                f"  {name}",
                "",
                "",
                _slow_text(f),
                str(f["executions"]),
                str(f["failures"]),
                fmt_float(f["rate"]),
                fmt_float(f["rate_low"]),
                fmt_float(f["rate_high"]),
                "",
                "",
                *([""] if dcgm else []),
                *([""] if nvml else []),
            ]
            for name, f in sorted(d.get("families", {}).items())
        ),
    ]


@click.command("report")
@click.option(
    "--since", default=DEFAULT_WINDOW, show_default=True, help="Window: a duration (90s, 30m, 12h, 7d, 2w) or 'all'."
)
@click.option("--device", default=None, help="Only this device id.")
@format_option("table", "json", "csv")
@confidence_option("Confidence of each one-sided Clopper-Pearson bound.")
@click.option(
    "--families",
    is_flag=True,
    help="Add each device's rates per kernel family (table: a row per family; csv: a family column).",
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help=f"Table: list healthy devices too (they are folded away in fleets over {_TABLE_ALL_UP_TO} devices).",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a PNG of the rate over time per device (needs matplotlib: pip install 'sdcguard-fleet[plot]').",
)
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write FILE: one self-contained HTML page of the whole fleet (status, rates over time, hosts, "
    "quarantine timeline, incidents), written atomically.",
)
@click.option(
    "--computed",
    is_flag=True,
    help="Compute every device's row, even where `sdcguard db refresh` kept this window's report (by default the "
    "report reads it, for up to --slow-max-age, and computes only the rows of the devices that changed since).",
)
@click.option(
    "--drills",
    is_flag=True,
    help="Report the fire drills instead (the drill store beside --db, or --drill-store): never part of the fleet's "
    "figures.",
)
@drill_store_option
@slow_max_age_option
@config_option
def report(
    since: str,
    device: str | None,
    fmt: str,
    confidence: float,
    families: bool,
    show_all: bool,
    plot: Path | None,
    html_file: Path | None = None,
    computed: bool = False,
    slow_max_age: str = DEFAULT_SLOW_MAX_AGE,
    config_path: Path | None = None,
    drills: bool = False,
    drill_store: Path | None = None,
) -> None:
    """Per-device SDC rates with one-sided bounds, and each device's status.

    Status: quarantined, probation (released, watched until clean scans), suspect (a failed execution in the
    window, not quarantined), healthy. Beside it, slow: the device's time for the same golden cases against its
    peers of the same model (thread CPU time on a core), flagged when clearly over the policy's slow threshold.

    Example: sdcguard report --since 7d --format json --families
    """
    now = time.time()
    start = since_timestamp(since, now=now)  # checked before the store is opened
    device = device_id(device) if device else None
    max_age = slow_max_age_s(slow_max_age)
    from ..fleet.slow import SlowSettings

    policy = load_policy(load_config(config_path))  # the [policy] slow_threshold, as the policy flags them
    slow = SlowSettings(threshold=policy.slow_threshold, confidence=policy.confidence)
    with _open(drills, drill_store) as store:
        lines = (
            None
            if device or families or computed  # a kept report has every device, without families
            else kept_lines(
                store, since=start, confidence=confidence, slow=slow, breaker=policy, now=now, slow_max_age_s=max_age
            )
        )
        if lines is None:
            rows = build_report(
                store,
                since=start,
                device=device,
                confidence=confidence,
                families=families,
                slow=slow,
                breaker=policy,
                now=now,
                slow_max_age_s=max_age,
            )
            lines = ReportLines.of(rows)
        if plot is not None:
            from ..fleet.report.plot import plot_rates

            plot_rates(store, plot, since=start, devices=[device] if device else None, now=now)
        if html_file is not None:
            from ..fleet.report.html import write_html

            write_html(
                store,
                html_file,
                since=start,
                window=since,
                now=now,
                confidence=confidence,
                slow=slow,
                slow_max_age_s=max_age,
            )
    if fmt == "json":
        click.echo(lines.json())
    elif fmt == "csv":
        csv.writer(sys.stdout, lineterminator="\n").writerows(report_csv_rows(list(lines.dicts())))
    else:
        _print_report(lines, since=since, confidence=confidence, show_all=show_all or device is not None)
    if plot is not None:
        click.echo(f"plot written to {plot}", err=True)
    if html_file is not None:
        click.echo(f"page written to {html_file}", err=True)
