"""``sdcguard report --plot``: failure rate over time per device, quarantined devices marked (matplotlib)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import BadInput
from .store import Store

__all__ = ["plot_rates"]

_MAX_DEVICES = 20


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
        raise BadInput("--plot needs matplotlib: pip install 'sdcguard[plot]'") from None
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: directory {path.parent} does not exist")
    t = time.time() if now is None else now
    start = since if since is not None else (store.first_execution_time() or t)
    span = max(t - start, 3600.0)
    width = span / 30  # about 30 bins across the window
    states = store.quarantine_states()
    if devices is None:
        picked = store.most_failing(since=start, limit=_MAX_DEVICES)
        picked += [d for d in sorted(states) if d not in picked][: max(0, _MAX_DEVICES - len(picked))]
        known = store.devices()
        if len(known) <= _MAX_DEVICES:  # a small fleet: draw everyone
            picked += [d.id for d in known if d.id not in picked]
    else:
        picked = list(devices)
    fig, ax = plt.subplots(figsize=(10, 5))
    if picked:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for p in store.rate_series(start=start, width_s=width, devices=picked):
            xs, ys = series.setdefault(p.device or "", ([], []))
            xs.append((start + (p.bin + 0.5) * width - t) / 86400.0)
            ys.append(p.failures / p.executions if p.executions else 0.0)
        since_q = {e.device: e.since for e in store.quarantine_list()}
        for dev in picked:
            xs, ys = series.get(dev, ([], []))
            state = states.get(dev)
            if state == "quarantined":
                line, = ax.plot(xs, ys, "x--", color="red", label=f"{dev} (quarantined)")
                if since_q.get(dev, start - 1) >= start:  # when it was taken out of service
                    ax.axvline((since_q[dev] - t) / 86400.0, color=line.get_color(), alpha=0.4, linestyle=":")
            elif state == "probation":
                ax.plot(xs, ys, "s:", label=f"{dev} (probation)")
            else:
                ax.plot(xs, ys, "o-", label=dev)
        title = "SDC failure rate per device"
    else:
        points = store.rate_series(start=start, width_s=width, devices=None)
        ax.plot([(start + (p.bin + 0.5) * width - t) / 86400.0 for p in points],
                [p.failures / p.executions if p.executions else 0.0 for p in points], "o-", label="fleet")
        title = "SDC failure rate, whole fleet (no device failed)"
    ax.set_xlim(-span / 86400.0, 0.0)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("days (0 = now)")
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
