"""``sdcguard report --html FILE``: one self-contained static page for the people who run the fleet.

What it shows, top to bottom: devices by status (colour-coded counts); the fleet's failure rate over time with
its bounds; a failure-rate sparkline per device that is not healthy (quarantined first); hosts ranked by their
quarantined and failing devices (lemon nodes stand out); the sortable per-device table (the text report's
fields); the quarantine history as a timeline and a list; training incidents with where to roll back; the
checkpoints the guard recorded.

Self-contained: inline CSS and script, plots as inline SVG (:mod:`.svg`), nothing fetched, no plotting
library, so it builds on the light install and opens from a file or any static web server. Bounded: every list
has a cap (:class:`HtmlLimits`), so a 10,000-device fleet with a year of history gives a page of a few hundred
kilobytes. Every string from the store is escaped. Data come from the store's named queries and
:func:`.devices.build_report`, the same rows the text report prints.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import __version__
from ...durations import iso_utc
from ...errors import BadInput
from ...records import Incident
from ..nvml import nvml_text
from ..rates import clopper_pearson, clopper_pearson_arrays
from ..slow import SlowSettings
from ..store.rows import SeriesPoint
from ..store.store import Store
from .devices import DeviceReport, build_report, dcgm_text
from .files import write_atomic
from .html_assets import PAGE_CSS, SORT_JS
from .html_parts import (
    STATUSES,
    HtmlLimits,
    checkpoints_section,
    counted,
    fmt,
    incidents_section,
    quarantine_section,
    quarantine_segments,
    slow_cell,
    status,
    table,
    td,
    time_cell,
)
from .svg import BinRate, Bins, bin_rates, choose_bins, esc, rate_chart, shared_decades, sparkline, status_bar

__all__ = ["HtmlLimits", "build_html", "write_html", "quarantine_segments"]


# ---------------------------------------------------------------------- sections
def _cards(rows: Sequence[DeviceReport], confidence: float) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    cards = "".join(
        f'<div class="card {s}"><b>{counts[s]:,}</b>{s}</div>'
        for s in ("healthy", "suspect", "quarantined", "probation")
    )
    n = sum(r.overall.executions for r in rows)
    k = sum(r.overall.failures for r in rows)
    lo, hi = clopper_pearson(k, n, confidence)
    hosts = len({r.host for r in rows})
    rate = f"fleet rate {k / n:.3g} (bounds {lo:.3g} .. {hi:.3g})" if n else "no executions in the window"
    return (
        f'<div class="cards">{cards}</div><p class="totals">{counted(len(rows), "device")} on '
        f"{counted(hosts, 'host')}; "
        f"{n:,} executions, {k:,} failed; {rate}.</p>"
    )


def _series(
    store: Store, bins: Bins, devices: Sequence[str] | None, confidence: float
) -> dict[str | None, list[BinRate]]:
    """Per-bin rates with bounds: per device (``devices``) or for the fleet (None)."""
    points = store.counts.series(start=bins.origin, width_s=bins.width, devices=devices)
    lows, highs = clopper_pearson_arrays([p.failures for p in points], [p.executions for p in points], confidence)
    grouped: dict[str | None, list[tuple[SeriesPoint, float, float]]] = {}
    for p, lo, hi in zip(points, lows.tolist(), highs.tolist(), strict=True):
        grouped.setdefault(p.device, []).append((p, lo, hi))
    return {d: bin_rates([g[0] for g in gs], [g[1] for g in gs], [g[2] for g in gs]) for d, gs in grouped.items()}


def _fleet_chart(store: Store, bins: Bins | None, confidence: float) -> str:
    head = "<h2>Fleet failure rate over time</h2>"
    if bins is None:
        return head + '<p class="note">No executions recorded in this window: nothing to plot yet.</p>'
    rates = _series(store, bins, None, confidence).get(None, [])
    if not rates:
        return head + '<p class="note">No executions recorded in this window: nothing to plot yet.</p>'
    return (
        head + f"<figure>{rate_chart(rates, bins, label='fleet failure rate over time')}<figcaption>Failed "
        f"executions / executions per {esc(bins.label)} bin (log scale), whole fleet. Grey band: one-sided "
        f"Clopper-Pearson bounds at {confidence:.0%} of each bin; red dot: the observed rate of a bin with a "
        "failure (a bin without one has no dot). Hover a bin for its counts.</figcaption></figure>"
    )


def _sparklines(
    store: Store,
    rows: Sequence[DeviceReport],
    bins: Bins | None,
    marks: dict[str, list[float]],
    confidence: float,
    limit: int,
) -> str:
    head = "<h2>Devices that are not healthy: failure rate over time</h2>"
    bad = [r for r in rows if r.status != "healthy"]
    if not bad:
        return head + '<p class="note">Every device is healthy in this window.</p>'
    picked = bad[:limit]
    series = _series(store, bins, [r.device for r in picked], confidence) if bins is not None else {}
    decades = shared_decades(list(series.values()))
    body = []
    for r in picked:
        spark = (
            sparkline(series.get(r.device, []), bins, decades, marks=marks.get(r.device, ()))
            if bins is not None
            else ""
        )
        body.append(
            f"<tr>{td(r.device)}{td(r.host)}{status(r.status)}"
            f"{td(f'{r.overall.failures:,} / {r.overall.executions:,}', n=True)}"
            f"{td(fmt(r.overall.rate), n=True)}{td(fmt(r.overall.rate_low), n=True)}"
            f"{td(fmt(r.overall.rate_high), n=True)}<td>{spark}</td></tr>"
        )
    more = f"; {len(bad) - len(picked):,} more in the table below" if len(bad) > len(picked) else ""
    scale = f"10^{decades[0] + 1} .. 10^{decades[1]}, 0 at the bottom"
    caption = (
        f"Per {bins.label} bin, one log scale for all ({scale}): grey band the bounds, red dot the rate, "
        f"red tick when the device was quarantined{more}."
        if bins is not None
        else ""
    )
    return head + table(
        [
            ("device", False),
            ("host", False),
            ("status", False),
            ("failed / executions", True),
            ("rate", True),
            ("rate_low", True),
            ("rate_high", True),
            ("over time", False),
        ],
        body,
        sortable=False,
        caption=caption,
    )


def _hosts(rows: Sequence[DeviceReport], confidence: float, limit: int) -> str:
    head = "<h2>Hosts: where the bad devices are</h2>"
    by_host: dict[str, list[DeviceReport]] = {}
    for r in rows:
        by_host.setdefault(r.host, []).append(r)
    stats = []
    for host, devs in by_host.items():
        counts = {s: sum(d.status == s for d in devs) for s in STATUSES}
        bad = len(devs) - counts["healthy"]
        slow = sum(bool(d.slowness and d.slowness.slow) for d in devs)
        if bad or slow:
            n = sum(d.overall.executions for d in devs)
            k = sum(d.overall.failures for d in devs)
            stats.append((host, devs, counts, bad, n, k, slow))
    if not stats:
        return head + f'<p class="note">Every device of the {counted(len(by_host), "host")} is healthy.</p>'
    stats.sort(key=lambda s: (-s[2]["quarantined"], -s[3], -s[5], -s[6], s[0]))
    widest = max(len(devs) for devs in by_host.values())
    body = []
    for host, devs, counts, bad, n, k, slow in stats[:limit]:
        lemon = bad >= 2
        lo, hi = clopper_pearson(k, n, confidence)
        badge = '<span class="badge">lemon?</span>' if lemon else ""
        body.append(
            f"<tr{' class=lemon' if lemon else ''}><td>{esc(host)}{badge}</td>{td(len(devs), n=True)}"
            f"{td(counts['quarantined'], n=True)}{td(counts['probation'], n=True)}{td(counts['suspect'], n=True)}"
            f"{td(slow, n=True, cls='slow' if slow else '')}"
            f"{td(f'{k:,}', n=True, v=k)}{td(f'{n:,}', n=True, v=n)}"
            f"{td(fmt(k / n if n else None), n=True, v=k / n if n else -1)}"
            f"{td(fmt(lo), n=True)}{td(fmt(hi), n=True)}<td>{status_bar(counts, scale=widest)}</td></tr>"
        )
    left = len(stats) - min(len(stats), limit)
    caption = (
        f"{len(stats):,} of {counted(len(by_host), 'host')} have a device that is not healthy or slow, ranked by "
        "quarantined devices, then devices not healthy, then failures, then slow devices"
        + (f" ({left:,} more not shown)" if left else "")
        + ". Two or more bad devices on one host point at the host (board, power, cooling), not the devices."
    )
    return head + table(
        [
            ("host", False),
            ("devices", True),
            ("quarantined", True),
            ("probation", True),
            ("suspect", True),
            ("slow", True),
            ("failures", True),
            ("executions", True),
            ("rate", True),
            ("rate_low", True),
            ("rate_high", True),
            ("devices by status", False),
        ],
        body,
        sortable=True,
        caption=caption,
    )


def _device_table(rows: Sequence[DeviceReport], limit: int) -> str:
    shown = rows[:limit]
    dcgm = any(r.dcgm is not None for r in shown)  # a column only where a DCGM diagnostic was imported
    nvml = any(r.nvml is not None for r in shown)  # and only where a GPU's scan read NVML's telemetry
    body = [
        f"<tr>{td(r.device)}{td(r.host)}{td(r.kind)}{td(r.model or '-')}"
        f"{td(f'{r.overall.executions:,}', n=True, v=r.overall.executions)}"
        f"{td(f'{r.overall.failures:,}', n=True, v=r.overall.failures)}"
        f"{td(fmt(r.overall.rate), n=True, v=r.overall.rate)}"
        f"{td(fmt(r.overall.rate_low), n=True, v=r.overall.rate_low)}"
        f"{td(fmt(r.overall.rate_high), n=True, v=r.overall.rate_high)}{status(r.status)}{slow_cell(r)}"
        f"{td(r.scans, n=True)}"
        f"{time_cell(r.last_scan)}{td(dcgm_text(r.dcgm) or '-') if dcgm else ''}"
        f"{td(nvml_text(r.nvml) or '-') if nvml else ''}</tr>"
        for r in shown
    ]
    caption = "Click a header to sort; again to reverse."
    if len(rows) > len(shown):
        caption += (
            f" {len(rows) - len(shown):,} healthy devices not listed (the first {len(shown):,} in report "
            "order are); `sdcguard report --format json` lists every device."
        )
    return "<h2>Devices</h2>" + table(
        [
            ("device", False),
            ("host", False),
            ("kind", False),
            ("model", False),
            ("executions", True),
            ("failures", True),
            ("rate", True),
            ("rate_low", True),
            ("rate_high", True),
            ("status", False),
            ("slow", True),
            ("scans", True),
            ("last scan (UTC)", "time"),
            *([("dcgm diag", False)] if dcgm else []),
            *([("nvml", False)] if nvml else []),
        ],
        body,
        sortable=True,
        caption=caption,
        scroll=True,
    )


# ---------------------------------------------------------------------- the page
def _page_bins(
    store: Store, since: float | None, now: float, history: Sequence[dict[str, Any]], incidents: Sequence[Incident]
) -> Bins | None:
    """The time axis every chart shares: from the window's start, or from the first thing recorded when that is
    later (an hour of data gets an hour's axis, not a week's), to now. None when nothing was recorded."""
    first = [
        t
        for t in (
            store.counts.first_execution(),
            min((float(h["time"]) for h in history), default=None),
            min((i.time for i in incidents), default=None),
        )
        if t is not None
    ]
    if not first:
        return None
    start = max(min(first), since) if since is not None else min(first)
    if start >= now:
        start = now - 60.0
    return choose_bins(start, now, whole_days_before=store.maintenance.pruned_before)


def build_html(
    store: Store,
    *,
    since: float | None,
    window: str,
    now: float | None = None,
    confidence: float = 0.95,
    limits: HtmlLimits = HtmlLimits(),
    slow: SlowSettings | None = None,
    slow_max_age_s: float = 0.0,
) -> str:
    """The whole page as one string. ``since``: start of the window (None: all time); ``window``: how the
    operator wrote it (``7d``, ``all``), for the heading. ``slow_max_age_s``: as :func:`~.devices.build_report`'s."""
    t = time.time() if now is None else now
    rows = build_report(store, since=since, confidence=confidence, slow=slow, now=t, slow_max_age_s=slow_max_age_s)
    history = store.quarantine.history()
    incidents = store.training.incidents(since=since)
    bins = _page_bins(store, since, t, history, incidents)
    hosts = {r.device: r.host for r in rows}
    marks: dict[str, list[float]] = {}
    for h in history:
        if h["action"] == "quarantine":
            marks.setdefault(h["device"], []).append(float(h["time"]))
    sections = [
        _cards(rows, confidence),
        _fleet_chart(store, bins, confidence),
        _sparklines(store, rows, bins, marks, confidence, limits.sparklines),
        _hosts(rows, confidence, limits.hosts),
        _device_table(rows, limits.table_rows),
        quarantine_section(history, hosts, bins, since, limits),
        incidents_section(incidents, limits.events),
        checkpoints_section(store.training.checkpoints(since=since), limits.events),
    ]
    title = f"sdcguard fleet report, {iso_utc(t)}"
    meta = (
        f"Store <code>{esc(store.path)}</code>; window {esc(window)}"
        f"{'' if since is None else f' (since {esc(iso_utc(since))})'}; generated {esc(iso_utc(t))} by "
        f"sdcguard {esc(__version__)}; bounds one-sided Clopper-Pearson at {confidence:.0%}."
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{PAGE_CSS}</style></head><body>"
        f'<h1>sdcguard fleet report</h1><p class="meta">{meta}</p>{"".join(sections)}'
        '<p class="meta">Status: quarantined (out of service), probation (released by hand, watched), suspect (a '
        "failed execution in the window), healthy (everything else). Rates: failed executions / executions of "
        f"golden cases (first attempts).</p><script>{SORT_JS}</script></body></html>\n"
    )


def write_html(
    store: Store,
    path: Path,
    *,
    since: float | None,
    window: str,
    now: float | None = None,
    confidence: float = 0.95,
    limits: HtmlLimits = HtmlLimits(),
    slow: SlowSettings | None = None,
    slow_max_age_s: float = 0.0,
) -> int:
    """Build the page and write it to ``path`` atomically (temporary file in the same directory, then a rename);
    returns its size in bytes. ``BadInput`` for a path that cannot be written, checked before the page is built."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise BadInput(f"cannot write {path}: directory {directory} does not exist")
    page = build_html(
        store,
        since=since,
        window=window,
        now=now,
        confidence=confidence,
        limits=limits,
        slow=slow,
        slow_max_age_s=slow_max_age_s,
    )
    write_atomic(path, page)
    return len(page.encode("utf-8"))
