"""Kept reports: the report's rows of a window, kept in the store by a refresh, and the report read from them.

At fleet scale the report's figures cost more to compute than an interactive read can afford (about 0.1 ms per
device: 10 s at 100,000 devices), while in any quarter of an hour only the few devices that scanned, or whose
oldest evidence left the window, say anything new. So ``sdcguard db refresh`` keeps, per window length, every
device's row as the report prints it (:func:`keep_report`): its JSON text, its version, its failures and its status.
A report of that window (:func:`kept_lines`) then computes the rows of only the devices the kept ones no longer
speak for, and takes the others' as kept. Those it computes, the *changed* devices, are:

- every device whose version differs from the kept one, or that the kept report does not know: each write that
  changes what a report keeps of a device (its results, scans, tallies, identity, a merge of any of these)
  adds one to its version in the same transaction (:meth:`~..store.core.StoreCore.lock_devices`);
- every device with an execution or a complete scan that started between the kept window's start and this one's
  (its oldest evidence left the window);
- every device a training ``slow`` incident of either window names (its slowness is read live).

**Proof that a kept row equals the computed one.** A row's fields are functions of (a) the device's identity, (b)
its tallies, rows and roll-ups in the window, (c) its latest complete scan ever, (d) its slowness verdict, (e) its
status. (e) is never kept: it is computed from the live quarantine table, the live breaker and incident suspects,
and the device's failures, which are part of (b). For a device left as kept: no write changed (a), (b) or (c) since
the versions were read, which was before the kept rows were computed (a write between the two makes the versions
differ, so the device is computed); the window's start moved from ``k`` to ``s``, within one UTC day (a kept
report whose window began on another day is not used, nor one kept before a prune: ``pruned_before`` is the same),
so the whole days, the roll-ups and the first day's midnight are the same, and the only evidence that left is what
started in ``[k, s)``, of which this device has none; whatever evidence of it is newer than the kept rows was
written by a write, which changed its version. So (b) and (c) are what they were. (d) is the kept verdict of the
refresh, used only while as young as ``--slow-max-age`` allows, as every report uses kept verdicts, and training
incidents, the one live part, make a device changed. Hence the row's text is the one the report would compute,
but for verdicts kept at the refresh instead of a later policy run's. The tests hold the JSON of both equal, byte
for byte, over writes, merges, prunes, quarantines, incidents and windows that move.

A kept report is derived data (never merged, forwarded or pruned); one that cannot be read is ignored with a
warning, and the report is computed.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...logs import get_logger
from ...records import SLOW_KIND
from ..breaker import BreakerSettings, suite_blamed_devices
from ..policy.settings import QuarantinePolicy
from ..slow import SlowSettings
from ..store.core import first_day
from ..store.rows import DeviceStatus
from .devices import REPORT_FIELDS, STATUS_ORDER, DeviceReport, build_report

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = ["ReportLines", "keep_report", "kept_lines"]

_log = get_logger("fleet")

_FORMAT = 1
"""The kept report's layout; a row's fields are :data:`~.devices.REPORT_FIELDS`, kept beside it (a sdcguard that
prints other fields computes its report)."""
_RANKS: dict[str, int] = {s: i for i, s in enumerate(STATUS_ORDER)}
"""A status's place in the report's order."""


@dataclass(frozen=True, slots=True)
class ReportLines:
    """A report in report order: per device its status rank, its failures negated, its id, and either its row or
    the JSON text of its row (a kept one)."""

    lines: list[tuple[int, int, str, DeviceReport | str]]

    @classmethod
    def of(cls, rows: Sequence[DeviceReport]) -> ReportLines:
        """The lines of rows in report order (:func:`~.devices.build_report`'s)."""
        return cls([(_RANKS[r.status], -r.overall.failures, r.device, r) for r in rows])

    def json(self) -> str:
        """The ``--format json`` text: what :func:`~.devices.report_json` gives for the same rows."""
        return "[" + ", ".join(x if isinstance(x, str) else json.dumps(x.as_dict()) for *_, x in self.lines) + "]"

    def dicts(self, statuses: Sequence[DeviceStatus] | None = None) -> Iterator[dict[str, Any]]:
        """Each row's JSON object (only those with a status among ``statuses``, when given)."""
        wanted = None if statuses is None else {_RANKS[s] for s in statuses}
        for rank, _, _, x in self.lines:
            if wanted is None or rank in wanted:
                yield json.loads(x) if isinstance(x, str) else x.as_dict()

    def counts(self) -> dict[DeviceStatus, int]:
        """Devices per status, in rank order."""
        n = np.bincount(np.fromiter((rank for rank, *_ in self.lines), np.int64, len(self.lines)), minlength=4)
        return dict(zip(STATUS_ORDER, n.tolist()))

    def __len__(self) -> int:
        return len(self.lines)


def _name(window_s: float | None) -> str:
    return "report.all" if window_s is None else f"report.{round(window_s)}"


def _settings(confidence: float, slow: SlowSettings) -> dict[str, Any]:
    return {"format": _FORMAT, "fields": list(REPORT_FIELDS), "confidence": confidence, "slow": asdict(slow)}


def _pack(values: Sequence[int], dtype: str) -> str:
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode()


def _unpack(text: str, dtype: str, n: int) -> list[int]:
    values = np.frombuffer(base64.b64decode(text, validate=True), dtype)
    if len(values) != n:
        raise ValueError(f"a kept column of {len(values)} values for {n} devices")
    out: list[int] = values.tolist()
    return out


def keep_report(
    store: Store,
    *,
    since: float | None,
    now: float,
    confidence: float = 0.95,
    slow: SlowSettings | None = None,
    breaker: BreakerSettings | None = None,
    slow_max_age_s: float = 0.0,
) -> int:
    """Compute the report of the window from ``since`` at ``now`` (every device, no families) and keep it for
    :func:`kept_lines`, replacing the one kept for a window of that length; returns its devices. Its slowness
    verdicts are those kept up to ``slow_max_age_s`` old (a refresh keeps them just before), else computed."""
    s = slow or SlowSettings()
    versions = store.summaries.device_versions()  # before the rows: a write in between leaves its device changed
    rows = build_report(
        store, since=since, confidence=confidence, slow=s, breaker=breaker, now=now, slow_max_age_s=slow_max_age_s
    )
    texts = [json.dumps(r.as_dict()) for r in rows]
    starts, marks, ends, at = [], [], [], 0
    for r, text in zip(rows, texts):
        mark = text.index('"status": ') + len('"status": ')
        starts.append(at)
        marks.append(at + mark)
        ends.append(at + mark + len(json.dumps(r.status)))
        at += len(text)
    window_s = None if since is None else now - since
    header = {
        **_settings(confidence, s),
        "at": now,
        "window_s": window_s,
        "first_day": first_day(since),
        "pruned_before": store.maintenance.pruned_before,
        "devices": [r.device for r in rows],
        "versions": _pack([versions.get(r.device, -1) for r in rows], "<i8"),
        "failures": _pack([r.overall.failures for r in rows], "<i8"),
        "ranks": _pack([_RANKS[r.status] for r in rows], "<u1"),
        "offsets": _pack([*starts, at, *marks, *ends], "<u8"),
    }
    store.summaries.keep(_name(window_s), header, body="".join(texts))
    return len(rows)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A kept report, read and checked."""

    at: float
    devices: list[str]
    versions: list[int]
    failures: list[int]
    ranks: list[int]
    offsets: list[int]
    body: str


def _read(
    store: Store, window_s: float | None, since: float | None, now: float, settings: Mapping[str, Any], max_age_s: float
) -> _Kept | None:
    name = _name(window_s)
    try:
        got = store.summaries.kept_with_body(name)
        if got is None:
            return None
        head, body = got
        if any(head.get(k) != v for k, v in settings.items()):
            return None
        at = float(head["at"])
        if not 0 <= now - at <= max_age_s or head["first_day"] != first_day(since):
            return None  # too old, or the window's first day moved: its whole days are others
        if head["pruned_before"] != store.maintenance.pruned_before:
            return None
        devices = list(head["devices"])
        n = len(devices)
        offsets = _unpack(head["offsets"], "<u8", 3 * n + 1)
        if offsets[n] != len(body):
            raise ValueError(f"a kept body of {len(body)} characters, {offsets[n]} expected")
        return _Kept(
            at=at,
            devices=devices,
            versions=_unpack(head["versions"], "<i8", n),
            failures=_unpack(head["failures"], "<i8", n),
            ranks=_unpack(head["ranks"], "<u1", n),
            offsets=offsets,
            body=body,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # binascii.Error and JSON's errors are ValueErrors
        _log.warning("the kept report %s of %s cannot be read (%s: %s); computing it", name, store.path, type(e), e)
        return None


def kept_lines(
    store: Store,
    *,
    since: float | None,
    now: float | None = None,
    confidence: float = 0.95,
    slow: SlowSettings | None = None,
    breaker: BreakerSettings | None = None,
    slow_max_age_s: float,
) -> ReportLines | None:
    """The report of the window from ``since`` (every device, no families), from the one kept for a window of
    its length when there is one as young as ``slow_max_age_s``: the rows of the changed devices computed
    (the module docstring says which), the others' as kept with their status of now. None when no kept report
    can be used (then :func:`~.devices.build_report` computes every row)."""
    t = time.time() if now is None else now
    s = slow or SlowSettings()
    window_s = None if since is None else t - since
    kept = _read(store, window_s, since, t, _settings(confidence, s), slow_max_age_s) if slow_max_age_s > 0 else None
    if kept is None:
        return None
    versions = store.summaries.device_versions()
    index = {d: i for i, d in enumerate(kept.devices)}
    changed = {d for d, v in versions.items() if (i := index.get(d)) is None or kept.versions[i] != v}
    kept_since = None if window_s is None else kept.at - window_s
    if since is not None and kept_since is not None and kept_since < since:
        changed |= store.summaries.devices_started_between(kept_since, since)
    changed |= {
        i.device for i in store.training.incidents(since=kept_since) if i.kind == SLOW_KIND and i.device is not None
    }
    changed &= versions.keys()
    rows = (
        build_report(
            store,
            since=since,
            devices=sorted(changed),
            confidence=confidence,
            slow=s,
            breaker=breaker,
            now=t,
            slow_max_age_s=slow_max_age_s,
        )
        if changed
        else []
    )
    lines: list[tuple[int, int, str, DeviceReport | str]] = [*ReportLines.of(rows).lines]
    same = [i for i, d in enumerate(kept.devices) if d not in changed and d in versions]
    failing = {kept.devices[i] for i in same if kept.failures[i] > 0}
    if failing:
        blamed = suite_blamed_devices(store.failures, breaker or QuarantinePolicy(), since=since or 0.0, now=t)
        failing -= {d for d, n in blamed.items() if d in failing and kept.failures[index[d]] == n}
    statuses = store.quarantine.statuses(suspect_since=since, devices=[kept.devices[i] for i in same], failing=failing)
    n, off, body = len(kept.devices), kept.offsets, kept.body
    for i in same:
        d = kept.devices[i]
        rank = _RANKS[statuses[d]]
        a, b, c, e = off[i], off[n + 1 + i], off[2 * n + 1 + i], off[i + 1]
        text = body[a:e] if rank == kept.ranks[i] else f'{body[a:b]}"{statuses[d]}"{body[c:e]}'
        lines.append((rank, -kept.failures[i], d, text))
    lines.sort()  # by rank, failures and id: ids are unique, so no two lines get to their last items
    return ReportLines(lines)
