"""``sdcguard report --plot``: failure rate over time per device, quarantined devices marked (matplotlib)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...durations import DAY_S
from ...errors import BadInput, needs_extra
from ..store.store import Store

__all__ = ["plot_rates", "PlotWindow", "plot_window"]

_MAX_DEVICES = 20
_BINS = 30
"""About this many bins across the span drawn."""
_MIN_SPAN_S = 600.0
"""The narrowest axis: ten minutes (a fresh store holds a few seconds of scans)."""
_UNITS = ((2 * 3600.0, 60.0, "minutes"), (2 * DAY_S, 3600.0, "hours"), (math.inf, DAY_S, "days"))
"""(longest span, unit in seconds, its name): an axis in the unit its span reads best in."""


@dataclass(frozen=True, kw_only=True)
class PlotWindow:
    """What the plot's time axis spans, how wide its bins are and in which unit it is labelled."""

    start: float
    """Unix time of the axis' left end (its right end is now)."""
    width_s: float
    """Width of one bin."""
    unit_s: float
    """Seconds per axis unit."""
    unit: str
    """``minutes``, ``hours`` or ``days``."""


def plot_window(since: float | None, first_execution: float | None, now: float) -> PlotWindow:
    """The axis of a plot of the window starting at ``since`` (None: all time): from the window's start, or from
    the first execution when the data starts later (a fresh store), to now, at least ten minutes; about 30 bins;
    labelled in minutes up to 2 hours, hours up to 2 days, days beyond."""
    first = first_execution if first_execution is not None else now
    start = max(since, first) if since is not None else first
    # at least ten minutes, but never reaching before the window asked for (--since 90s draws 90 seconds)
    span = max(now - start, min(_MIN_SPAN_S, now - since) if since is not None else _MIN_SPAN_S, 1.0)
    unit_s, unit = next((u, name) for longest, u, name in _UNITS if span <= longest)
    return PlotWindow(start=now - span, width_s=span / _BINS, unit_s=unit_s, unit=unit)


def plot_rates(
    store: Store, path: Path, *, since: float | None, devices: Sequence[str] | None = None, now: float | None = None
) -> list[str]:
    """Write a PNG of the failure rate per time bin for each device; returns the devices drawn.

    Without ``devices`` it draws every device of a fleet of at most 20; in a larger fleet the devices that failed
    in the window or are quarantined or on probation (at most 20, most failures first), else the whole fleet as
    one line.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise needs_extra("--plot", "matplotlib", "plot") from None
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: directory {path.parent} does not exist")
    t = time.time() if now is None else now
    window = plot_window(since, store.counts.first_execution(), t)
    start, width, unit_s = window.start, window.width_s, window.unit_s
    states = store.quarantine.states()
    if devices is None:
        picked = store.failures.most_failing(since=start, limit=_MAX_DEVICES)
        picked += [d for d in sorted(states) if d not in picked][: max(0, _MAX_DEVICES - len(picked))]
        known = store.scans.devices()
        if len(known) <= _MAX_DEVICES:  # a small fleet: draw everyone
            picked += [d.id for d in known if d.id not in picked]
    else:
        picked = list(devices)
    fig, ax = plt.subplots(figsize=(10, 5))
    if picked:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for p in store.counts.series(start=start, width_s=width, devices=picked):
            xs, ys = series.setdefault(p.device or "", ([], []))
            xs.append((start + (p.bin + 0.5) * width - t) / unit_s)
            ys.append(p.failures / p.executions if p.executions else 0.0)
        since_q = {e.device: e.since for e in store.quarantine.entries()}
        for dev in picked:
            xs, ys = series.get(dev, ([], []))
            state = states.get(dev)
            if state == "quarantined":
                (line,) = ax.plot(xs, ys, "x--", color="red", label=f"{dev} (quarantined)")
                if since_q.get(dev, start - 1) >= start:  # when it was taken out of service
                    ax.axvline((since_q[dev] - t) / unit_s, color=line.get_color(), alpha=0.4, linestyle=":")
            elif state == "probation":
                ax.plot(xs, ys, "s:", label=f"{dev} (probation)")
            else:
                ax.plot(xs, ys, "o-", label=dev)
        title = "SDC failure rate per device"
    else:
        points = store.counts.series(start=start, width_s=width, devices=None)
        ax.plot(
            [(start + (p.bin + 0.5) * width - t) / unit_s for p in points],
            [p.failures / p.executions if p.executions else 0.0 for p in points],
            "o-",
            label="fleet",
        )
        title = "SDC failure rate, whole fleet (no device failed)"
    ax.set_xlim((start - t) / unit_s, 0.0)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel(f"{window.unit} (0 = now)")
    ax.set_ylabel("failed executions / executions")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return picked
