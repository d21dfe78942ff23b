"""The HTML report's pieces: escaped table cells and tables (sortable or not), status badges, numbers and times as
the page prints them, and the sections that list records (the quarantine timeline and history, training incidents,
checkpoints). :mod:`.html` puts the page together."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...durations import iso_utc
from ...records import Incident
from ..store.rows import CheckpointEntry
from .devices import DeviceReport
from .svg import Bins, Segment, TimelineRow, esc, timeline

__all__ = [
    "counted",
    "STATUSES",
    "fmt",
    "td",
    "th",
    "table",
    "status",
    "slow_cell",
    "time_cell",
    "quarantine_segments",
    "quarantine_section",
    "incidents_section",
    "checkpoints_section",
]


def counted(n: int, noun: str) -> str:
    """``n`` and its noun, singular for one: ``1 host``, ``2 hosts``, ``1,000 devices``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


@dataclass(frozen=True, kw_only=True)
class HtmlLimits:
    """How much of each list the page shows; what is left out is counted on the page."""

    table_rows: int = 1000
    """Rows of the device table: quarantined, probation and suspect devices first, then healthy ones."""
    sparklines: int = 40
    """Devices that are not healthy with a rate-over-time sparkline (in the table's order)."""
    hosts: int = 30
    """Hosts in the ranking (only hosts with a device that is not healthy are ranked)."""
    timeline_devices: int = 40
    """Devices on the quarantine timeline (most recent change first)."""
    events: int = 200
    """Rows of the quarantine history, the incident and the checkpoint lists (newest first)."""

    def __post_init__(self) -> None:
        for name in ("table_rows", "sparklines", "hosts", "timeline_devices", "events"):
            if getattr(self, name) < 0:
                raise ValueError(f"HtmlLimits.{name} must be >= 0")


STATUSES = ("quarantined", "probation", "suspect", "healthy")


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def td(text: object, *, n: bool = False, v: object = None, cls: str = "") -> str:
    """One cell; ``v``: its sort key (numbers, Unix times) when it differs from the text."""
    classes = " ".join(c for c in ("n" if n else "", cls) if c)
    attrs = (f' class="{classes}"' if classes else "") + ("" if v is None else f' data-v="{esc(v)}"')
    return f"<td{attrs}>{esc(text)}</td>"


def th(name: str, kind: bool | str) -> str:
    """A header: ``kind`` True for a number (right-aligned, sorted as a number), ``"time"`` for a time (sorted by
    its cells' Unix times), False for text."""
    attrs = " class=n" if kind is True else ' data-sort="num"' if kind == "time" else ""
    return f'<th{attrs} scope="col">{esc(name)}</th>'


def table(
    columns: Sequence[tuple[str, bool | str]],
    rows: Iterable[str],
    *,
    sortable: bool,
    caption: str = "",
    scroll: bool = False,
) -> str:
    """A table: ``columns`` are (name, kind, see :func:`th`); ``rows`` ready ``<tr>`` markup."""
    head = "".join(th(name, kind) for name, kind in columns)
    cls = ' class="sortable"' if sortable else ""
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    table = f"<table{cls}>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return f'<div class="scroll">{table}</div>' if scroll else table


def status(status: str) -> str:
    return (
        f'<td class="st {esc(status)}" data-v="{STATUSES.index(status) if status in STATUSES else 9}">'
        f"{esc(status)}</td>"
    )


def slow_cell(r: DeviceReport) -> str:
    """The device table's ``slow`` cell: its slowdown against its peers, highlighted when it is slow."""
    s = r.slowness
    if s is None or (s.slowdown is None and not s.slow):
        return '<td class="n" data-v="-1">-</td>'
    text = "slow" if s.slowdown is None else f"{s.slowdown:.2f}x"
    title = esc(f"{s.reason} (basis {s.basis}, confidence {s.confidence})")
    cls = "n slow" if s.slow else "n"
    return f'<td class="{cls}" data-v="{s.slowdown or 0}" title="{title}">{esc(text)}{" slow" if s.slow else ""}</td>'


def time_cell(t: float | None) -> str:
    return td((iso_utc(t) or "never").replace("T", " ").rstrip("Z"), v=-1 if t is None else f"{t:.0f}")


def quarantine_segments(history: Sequence[dict[str, Any]]) -> dict[str, list[Segment]]:
    """Each device's quarantined and probation stretches, from its quarantine history (oldest first)."""
    out: dict[str, list[Segment]] = {}
    open_: dict[str, Segment] = {}
    for h in history:
        device, action, t, reason = h["device"], h["action"], float(h["time"]), str(h["reason"])
        prev = open_.pop(device, None)
        if prev is not None:
            out.setdefault(device, []).append(Segment(state=prev.state, start=prev.start, end=t, reason=prev.reason))
        if action in ("quarantine", "release"):
            state = "quarantined" if action == "quarantine" else "probation"
            open_[device] = Segment(state=state, start=t, end=None, reason=reason)
        else:
            out.setdefault(device, [])
    for device, seg in open_.items():
        out.setdefault(device, []).append(seg)
    return out


def quarantine_section(
    history: Sequence[dict[str, Any]], hosts: dict[str, str], bins: Bins | None, since: float | None, limits: HtmlLimits
) -> str:
    head = "<h2>Quarantine history</h2>"
    if not history:
        return head + '<p class="note">No device has ever been quarantined.</p>'
    segments = quarantine_segments(history)
    last_change = {h["device"]: float(h["time"]) for h in history}
    parts = [head]
    if bins is not None:
        visible = [d for d, segs in segments.items() if any(s.end is None or s.end >= bins.origin for s in segs)]
        visible.sort(key=lambda d: -last_change[d])
        rows = [
            TimelineRow(device=d, host=hosts.get(d, "?"), segments=tuple(segments[d]))
            for d in visible[: limits.timeline_devices]
        ]
        if rows:
            more = len(visible) - len(rows)
            parts.append(
                f"<figure>{timeline(rows, bins)}<figcaption>Red: quarantined; purple: on probation "
                "(released by hand, watched until clean scans); hover for the reason. Most recent change "
                f"first{f'; {more:,} more devices not drawn' if more else ''}.</figcaption></figure>"
            )
    recent = [h for h in history if since is None or float(h["time"]) >= since][::-1][: limits.events]
    body = [
        f"<tr>{time_cell(float(h['time']))}{td(h['device'])}{td(hosts.get(h['device'], '?'))}{td(h['action'])}"
        f"{td(h['by'])}{td(h['reason'], cls='wrap')}</tr>"
        for h in recent
    ]
    if body:
        parts.append(
            table(
                [
                    ("time (UTC)", "time"),
                    ("device", False),
                    ("host", False),
                    ("change", False),
                    ("by", False),
                    ("reason", False),
                ],
                body,
                sortable=True,
                caption=f"The last {len(body):,} changes in the window, newest first.",
            )
        )
    else:
        parts.append('<p class="note">No quarantine change in this window.</p>')
    return "".join(parts)


def incidents_section(found: Sequence[Incident], limit: int) -> str:
    head = "<h2>Training incidents</h2>"
    if not found:
        return head + '<p class="note">No training incident recorded in this window.</p>'
    shown = list(found)[::-1][:limit]
    body = [
        f"<tr>{time_cell(i.time)}{td(i.kind)}{td(i.steps(), n=True, v=i.step)}{td(i.job or '-')}"
        f"{td(','.join(map(str, i.suspect_ranks)) or '-')}"
        f"{td(', '.join(i.devices or ((i.device,) if i.device else ())) or '-')}{td(', '.join(i.hosts) or '-')}"
        f"{td(i.roll_back_to())}{td(i.detail, cls='wrap')}</tr>"
        for i in shown
    ]
    more = f" ({len(found) - len(shown):,} older not shown)" if len(found) > len(shown) else ""
    return head + table(
        [
            ("time (UTC)", "time"),
            ("kind", False),
            ("step", True),
            ("job", False),
            ("ranks", False),
            ("devices", False),
            ("hosts", False),
            ("roll back to", False),
            ("detail", False),
        ],
        body,
        sortable=True,
        caption="Newest first. Roll back to: the newest verified checkpoint older than the first "
        f"step the fault could have touched{more}.",
    )


def checkpoints_section(found: Sequence[CheckpointEntry], limit: int) -> str:
    head = "<h2>Checkpoints</h2>"
    if not found:
        return head + '<p class="note">No checkpoint recorded in this window.</p>'
    shown = list(found)[::-1][:limit]
    body = [
        f"<tr>{time_cell(c.time)}{td(c.job or '-')}{td(c.checkpoint_id)}{td(c.step, n=True)}"
        f"{td('verified' if c.verified else 'not verified', cls='st ' + ('healthy' if c.verified else 'suspect'))}"
        f"<td><code>{esc(c.digest[:16] or '-')}</code></td></tr>"
        for c in shown
    ]
    more = f" ({len(found) - len(shown):,} older not shown)" if len(found) > len(shown) else ""
    return head + table(
        [
            ("time (UTC)", "time"),
            ("job", False),
            ("checkpoint", False),
            ("step", True),
            ("verified", False),
            ("digest", False),
        ],
        body,
        sortable=True,
        caption=f"Checkpoints the training guard saved, newest first{more}.",
    )
