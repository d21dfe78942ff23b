"""Inline SVG for the HTML report: time bins, failure rates with their bounds, status bars, a quarantine timeline.

Plain strings, no plotting library: the page must build on the light scan-node install (no matplotlib, no
torch) and load with nothing fetched from the network. Every text that reaches the markup goes through
:func:`esc`. Rates span orders of magnitude (1e-6 for the fleet, 1e-1 for a dying GPU), so the rate axes are
logarithmic; a rate of zero sits on the axis floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from ...durations import DAY_S
from ..store.rows import SeriesPoint

__all__ = [
    "STATUS_COLOURS",
    "Bins",
    "BinRate",
    "Segment",
    "TimelineRow",
    "esc",
    "choose_bins",
    "bin_rates",
    "rate_chart",
    "sparkline",
    "shared_decades",
    "status_bar",
    "timeline",
]

STATUS_COLOURS = {"healthy": "#2e7d32", "suspect": "#e08e00", "quarantined": "#c62828", "probation": "#7b1fa2"}
"""One colour per device status, shared by the cards, the table, the bars and the timeline."""

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, DAY_S
_WIDTHS = (_MINUTE, 5 * _MINUTE, 15 * _MINUTE, _HOUR, 3 * _HOUR, 6 * _HOUR, 12 * _HOUR, _DAY, 7 * _DAY, 28 * _DAY)
_MAX_BINS = 120
_FLOOR = 1e-12


def esc(text: object) -> str:
    """Text or an attribute value, safe inside HTML and SVG (``& < > " '`` escaped)."""
    return escape(str(text), quote=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bins:
    """The time grid of every chart on a page: ``count`` bins of ``width`` seconds from ``origin`` to ``end``."""

    origin: float
    """A multiple of ``width`` (UTC): whole days stay whole days, so daily roll-ups fall in one bin."""
    width: float
    count: int
    end: float

    @property
    def label(self) -> str:
        """``3 h``, ``1 d``, ``15 min``: the width for a caption."""
        w = self.width
        return f"{w / _DAY:g} d" if w >= _DAY else f"{w / _HOUR:g} h" if w >= _HOUR else f"{w / _MINUTE:g} min"


def choose_bins(start: float, end: float, *, whole_days_before: float | None = None) -> Bins:
    """The smallest width of 1 min .. 28 d that covers ``start``..``end`` in at most 120 bins.

    ``whole_days_before``: the store's retention horizon; a window reaching before it holds daily roll-ups,
    which a bin narrower than a day would show as one spike at midnight, so the width is at least a day.
    """
    span = max(end - start, _MINUTE)
    width = next((w for w in _WIDTHS if span / w <= _MAX_BINS), _WIDTHS[-1])
    if whole_days_before is not None and start < whole_days_before:
        width = max(width, _DAY)
    origin = math.floor(start / width) * width
    return Bins(origin=origin, width=width, count=max(1, math.ceil((end - origin) / width)), end=end)


@dataclass(frozen=True, kw_only=True, slots=True)
class BinRate:
    """One bin of a rate series: its counts, observed rate and one-sided bounds."""

    bin: int
    executions: int
    failures: int
    rate: float
    low: float
    high: float


def bin_rates(points: Sequence[SeriesPoint], lows: Sequence[float], highs: Sequence[float]) -> list[BinRate]:
    """Zip a series with its bounds (computed by the caller, vectorised)."""
    return [
        BinRate(
            bin=p.bin,
            executions=p.executions,
            failures=p.failures,
            rate=p.failures / p.executions if p.executions else 0.0,
            low=lo,
            high=hi,
        )
        for p, lo, hi in zip(points, lows, highs, strict=True)
        if p.executions > 0
    ]


def _time_label(t: float, width: float) -> str:
    d = datetime.fromtimestamp(t, tz=UTC)
    return d.strftime("%Y-%m-%d") if width >= _DAY else d.strftime("%m-%d %H:%M")


_TICK_CHAR_PX = 6.5
"""Width of one character of a tick label at the page's 11 px font, a little over its digits' (html_assets)."""


def _time_ticks(f: _Frame, bins: Bins, *, width: int, grid: tuple[float, float], text_y: float) -> list[str]:
    """The time axis of a chart: a grid line and a label at up to 9 bin edges. A label is centred on its tick, but
    one that would cross the chart's edge ends (right) or starts (left) at it, so every label stays inside."""
    out = []
    every = max(1, math.ceil(bins.count / 8))
    for b in range(0, bins.count + 1, every):
        t = bins.origin + b * bins.width
        x, label = f.x(t), _time_label(t, bins.width)
        half = len(label) * _TICK_CHAR_PX / 2
        anchor = "end" if x + half > width else "start" if x - half < 0 else "middle"
        out.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{grid[0]}" y2="{grid[1]}"/>'
            f'<text class="tick" x="{x:.1f}" y="{text_y}" text-anchor="{anchor}">{esc(label)}</text>'
        )
    return out


def _decades(rates: Sequence[BinRate]) -> tuple[int, int]:
    """The log10 range of a rate axis: every positive bound and rate inside, at most 1, and one decade more at
    the bottom: that line stands for zero (a bin without failures has a rate and lower bound of 0)."""
    values = [v for r in rates for v in (r.low, r.rate, r.high) if v > 0]
    if not values:
        return -7, 0
    lo = math.floor(math.log10(max(min(values), _FLOOR))) - 1
    hi = min(math.ceil(math.log10(max(values))), 0)
    return (lo, hi) if hi > lo + 1 else (hi - 2, hi)


class _Frame:
    """Pixel mapping of one chart: time on x (the bins), log10 rate on y."""

    def __init__(self, bins: Bins, decades: tuple[int, int], x0: float, x1: float, y0: float, y1: float) -> None:
        self.bins, self.decades = bins, decades
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1

    def x(self, t: float) -> float:
        span = self.bins.count * self.bins.width
        return self.x0 + (self.x1 - self.x0) * min(max((t - self.bins.origin) / span, 0.0), 1.0)

    def y(self, rate: float) -> float:
        lo, hi = self.decades
        v = math.log10(rate) if rate > 0 else lo
        return self.y1 - (self.y1 - self.y0) * (min(max(v, lo), hi) - lo) / (hi - lo)

    def bars(self, rates: Sequence[BinRate], *, titles: bool) -> list[str]:
        """One band (low..high) per bin with executions, a dot where it failed."""
        w = self.bins.width
        out = []
        for r in rates:
            t0 = self.bins.origin + r.bin * w
            xa, xb = self.x(t0), self.x(t0 + w)
            top, bottom = self.y(r.high), self.y(r.low)
            tip = ""
            if titles:
                tip = (
                    f"<title>{esc(_time_label(t0, w))}: {r.failures:,} failed of {r.executions:,}, rate "
                    f"{r.rate:.3g} (bounds {r.low:.3g} .. {r.high:.3g})</title>"
                )
            out.append(
                f'<rect class="band" x="{xa:.1f}" y="{top:.1f}" width="{max(xb - xa - 0.5, 0.8):.1f}" '
                f'height="{max(bottom - top, 1.0):.1f}">{tip}</rect>'
            )
            if r.failures:
                out.append(f'<circle class="dot" cx="{(xa + xb) / 2:.1f}" cy="{self.y(r.rate):.1f}" r="2.5"/>')
        return out


def rate_chart(rates: Sequence[BinRate], bins: Bins, *, label: str, width: int = 1180, height: int = 240) -> str:
    """A failure-rate chart with axes: per bin, the band between the bounds and the observed rate (a dot, for bins
    with a failure). ``label``: the chart's accessible name."""
    f = _Frame(bins, _decades(rates), 64.0, width - 12.0, 10.0, height - 28.0)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(label)}">'
    ]
    lo, hi = f.decades
    step = max(1, (hi - lo) // 6)
    for d in (lo, *range(lo + 1, hi + 1, step)):
        y = f.y(10.0**d)
        text = "0" if d == lo else "1" if d == 0 else f"1e{d}"
        parts.append(
            f'<line class="grid" x1="{f.x0}" x2="{f.x1}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{f.x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{text}</text>'
        )
    parts.extend(_time_ticks(f, bins, width=width, grid=(f.y0, f.y1), text_y=height - 10))
    parts.extend(f.bars(rates, titles=True))
    parts.append(f'<line class="axis" x1="{f.x0}" x2="{f.x1}" y1="{f.y1}" y2="{f.y1}"/></svg>')
    return "".join(parts)


def sparkline(
    rates: Sequence[BinRate],
    bins: Bins,
    decades: tuple[int, int],
    *,
    marks: Sequence[float] = (),
    width: int = 300,
    height: int = 36,
) -> str:
    """A small rate chart on a shared log scale (``decades``, see :func:`shared_decades`); ``marks``: times
    drawn as red ticks (when the device was quarantined)."""
    f = _Frame(bins, decades, 1.0, width - 1.0, 2.0, height - 2.0)
    parts = [
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="failure rate over time">',
        f'<line class="axis" x1="0" x2="{width}" y1="{height - 1}" y2="{height - 1}"/>',
    ]
    parts.extend(f.bars(rates, titles=False))
    for t in marks:
        if bins.origin <= t <= bins.end:
            x = f.x(t)
            parts.append(f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height}"/>')
    parts.append("</svg>")
    return "".join(parts)


def shared_decades(series: Sequence[Sequence[BinRate]]) -> tuple[int, int]:
    """One log range for several sparklines, so their heights compare."""
    return _decades([r for s in series for r in s])


def status_bar(counts: dict[str, int], *, scale: int, width: int = 160, height: int = 12) -> str:
    """A host's devices as one stacked bar, a segment per status (quarantined first); ``scale``: the device
    count of the largest host, so bars compare."""
    x = 0.0
    unit = width / max(scale, 1)
    parts = [
        f'<svg class="bar" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(", ".join(f"{n} {s}" for s, n in counts.items() if n))}">'
    ]
    for status in ("quarantined", "probation", "suspect", "healthy"):
        n = counts.get(status, 0)
        if n:
            parts.append(
                f'<rect x="{x:.1f}" y="0" width="{n * unit:.1f}" height="{height}" fill="{STATUS_COLOURS[status]}"/>'
            )
            x += n * unit
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """A stretch of time a device spent quarantined or on probation (``end`` None: still is)."""

    state: str
    start: float
    end: float | None
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TimelineRow:
    """One device's line of the quarantine timeline."""

    device: str
    host: str
    segments: tuple[Segment, ...]


def timeline(rows: Sequence[TimelineRow], bins: Bins, *, width: int = 1180, row_h: int = 18) -> str:
    """The quarantine history as one line per device: quarantined and probation stretches on the time axis,
    each with its reason as a tooltip."""
    label_w, pad = 230.0, 24.0
    height = int(len(rows) * row_h + pad + 6)
    f = _Frame(bins, (-1, 0), label_w, width - 12.0, 0.0, 1.0)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="quarantine timeline">'
    ]
    parts.extend(_time_ticks(f, bins, width=width, grid=(0, height - pad), text_y=height - 8))
    for i, row in enumerate(rows):
        y = i * row_h + 2
        parts.append(
            f'<text class="lab" x="{label_w - 8}" y="{y + row_h - 6}" text-anchor="end">'
            f"{esc(row.device)}<title>{esc(row.device)} on {esc(row.host)}</title></text>"
        )
        for s in row.segments:
            xa, xb = f.x(s.start), f.x(bins.end if s.end is None else s.end)
            until = "now" if s.end is None else _time_label(s.end, 0.0)
            parts.append(
                f'<rect x="{xa:.1f}" y="{y + 2}" width="{max(xb - xa, 2.0):.1f}" height="{row_h - 6}" '
                f'fill="{STATUS_COLOURS.get(s.state, "#777")}"><title>{esc(s.state)} '
                f"{esc(_time_label(s.start, 0.0))} .. {esc(until)}: {esc(s.reason)}</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)
