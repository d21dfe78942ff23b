"""``sdcguard report --plot``: failure rate over time per device, quarantined devices marked (matplotlib)."""

from __future__ import annotations

import json
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
    start = since if since is not None else (store.scalar("SELECT MIN(started_at) FROM results") or t)
    span = max(t - start, 3600.0)
    width = span / 30  # about 30 bins across the window
    states = dict(store._conn.execute("SELECT device, state FROM quarantine").fetchall())
    if devices is None:
        picked = [
            r[0]
            for r in store._conn.execute(
                "SELECT device, COUNT(*) AS n FROM results WHERE passed = 0 AND started_at >= ? GROUP BY device "
                "ORDER BY n DESC, device LIMIT ?",
                (start, _MAX_DEVICES),
            )
        ]
        picked += [d for d in sorted(states) if d not in picked][: max(0, _MAX_DEVICES - len(picked))]
        if store.scalar("SELECT COUNT(*) FROM devices") <= _MAX_DEVICES:  # a small fleet: draw everyone
            picked += [r[0] for r in store._conn.execute("SELECT id FROM devices ORDER BY id") if r[0] not in picked]
    else:
        picked = list(devices)
    fig, ax = plt.subplots(figsize=(10, 5))
    if picked:
        rows = store._conn.execute(
            "SELECT device, CAST((started_at - ?) / ? AS INTEGER) AS b, SUM((attempt = 0) * executions), "
            "SUM(attempt = 0 AND passed = 0) FROM results WHERE started_at >= ? "
            "AND device IN (SELECT value FROM json_each(?)) GROUP BY device, b ORDER BY device, b",
            (start, width, start, json.dumps(picked)),
        ).fetchall()
        series: dict[str, tuple[list[float], list[float]]] = {}
        for dev, b, n, k in rows:
            xs, ys = series.setdefault(dev, ([], []))
            xs.append((start + (b + 0.5) * width - t) / 86400.0)
            ys.append(k / n if n else 0.0)
        for dev in picked:
            xs, ys = series.get(dev, ([], []))
            state = states.get(dev)
            if state == "quarantined":
                line, = ax.plot(xs, ys, "x--", color="red", label=f"{dev} (quarantined)")
                since_q = store.scalar("SELECT since FROM quarantine WHERE device = ?", (dev,))
                if since_q is not None and since_q >= start:  # when it was taken out of service
                    ax.axvline((since_q - t) / 86400.0, color=line.get_color(), alpha=0.4, linestyle=":")
            elif state == "probation":
                ax.plot(xs, ys, "s:", label=f"{dev} (probation)")
            else:
                ax.plot(xs, ys, "o-", label=dev)
        title = "SDC failure rate per device"
    else:
        rows = store._conn.execute(
            "SELECT CAST((started_at - ?) / ? AS INTEGER) AS b, SUM((attempt = 0) * executions), SUM(attempt = 0 AND passed = 0) "
            "FROM results WHERE started_at >= ? GROUP BY b ORDER BY b",
            (start, width, start),
        ).fetchall()
        ax.plot([(start + (b + 0.5) * width - t) / 86400.0 for b, _, _ in rows],
                [k / n if n else 0.0 for _, n, k in rows], "o-", label="fleet")
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
