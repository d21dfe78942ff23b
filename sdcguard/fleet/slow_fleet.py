"""The slowness of a fleet's devices, from its store: computed by the rule of :mod:`.slow` from the case tallies, or
read from the verdicts the store keeps for a window (what a report at fleet scale reads instead of every device's
time for every case)."""

from __future__ import annotations

import base64
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..logs import get_logger
from ..records import SLOW_KIND, DeviceInfo, Incident
from .slow import Slowness, SlowSettings, judge_slow, peer_group
from .store.rows import CaseTimes, CaseTiming

if TYPE_CHECKING:
    from .store.store import Store

__all__ = [
    "SlownessInputs",
    "read_slowness",
    "judge_fleet",
    "with_training",
    "fleet_slowness",
    "keep_verdicts",
    "kept_verdicts",
]

_log = get_logger("fleet")

_KEPT = "slowness"
"""The store's kept summaries of slowness verdicts: ``slowness.<window seconds>`` (``slowness.all`` for all time)."""
_KEPT_FORMAT = 3
_KEPT_TEXT = ("basis", "confidence", "reason")
"""Text columns kept as their distinct values and an index per device (a healthy fleet's reasons repeat: at 20,000
devices they were 46% of the summary's bytes as plain lists); the device ids are kept as a plain list."""
_KEPT_NUMBERS = ("slowdown", "slowdown_low", "history", "threshold", "peers", "cases")


def _kept_name(window_s: float | None) -> str:
    return f"{_KEPT}.all" if window_s is None else f"{_KEPT}.{round(window_s)}"


def _window(since: float | None, now: float) -> float | None:
    return None if since is None else now - since


@dataclass(frozen=True)
class SlownessInputs:
    """What the slowness rule weighs, read from the store at once (:func:`read_slowness`)."""

    known: tuple[DeviceInfo, ...]
    """Every device of the store."""
    groups: Mapping[str, str]
    """Each of them -> its peer group (:func:`~.slow.peer_group`: kind and model, or host)."""
    times: CaseTimes
    """Passing first executions per device and case in the window and their summed device time."""
    history: Sequence[CaseTiming]
    """The same per scan, for the devices of a peer group too small for a spread (their own history counts)."""


def read_slowness(
    store: Store, *, since: float | None, settings: SlowSettings, known: Sequence[DeviceInfo] | None = None
) -> SlownessInputs:
    """Read what :func:`judge_fleet` weighs: every device's times per case from the store's case tallies (two rows
    per device and case whatever the window), and per-scan rows only where a device's own history can matter (a
    group too small for a spread). ``known``: every device of the store, when the caller has read them already."""
    devices = tuple(store.scans.devices() if known is None else known)
    groups = {d.id: peer_group(d.kind, d.model, d.host) for d in devices}
    sizes = Counter(groups.values())
    small = sorted(d for d, g in groups.items() if sizes[g] <= settings.min_peers)
    history = store.counts.case_timings(since=since, devices=small) if small else []
    return SlownessInputs(known=devices, groups=groups, times=store.counts.case_times(since=since), history=history)


def judge_fleet(inputs: SlownessInputs, settings: SlowSettings) -> dict[str, Slowness]:
    """Every device's verdict by the rule of :mod:`.slow` (:func:`judge_slow`, the whole fleet as peers): a pure
    function of what :func:`read_slowness` read. What the store keeps (:func:`keep_verdicts`)."""
    return judge_slow(inputs.times, inputs.groups, settings, history=inputs.history)


def with_training(
    verdicts: Mapping[str, Slowness], incidents: Iterable[Incident], *, wanted: AbstractSet[str]
) -> dict[str, Slowness]:
    """``verdicts`` of the ``wanted`` devices, with the training jobs' ``slow`` incidents (a device named by one is
    slow, basis ``training``). A pure function of its arguments."""
    out = {d: v for d, v in verdicts.items() if d in wanted}
    for i in incidents:
        if i.kind != SLOW_KIND or i.device is None or i.device not in wanted:
            continue
        mine = out.get(i.device)
        if mine is None or not mine.slow:
            out[i.device] = Slowness(
                device=i.device,
                slow=True,
                basis="training",
                confidence="medium",
                slowdown=mine.slowdown if mine else None,
                slowdown_low=mine.slowdown_low if mine else None,
                families=mine.families if mine else {},
                reason=f"training job {i.job}, step {i.step}: {i.detail}",
            )
    return out


def fleet_slowness(
    store: Store,
    *,
    since: float | None,
    settings: SlowSettings | None = None,
    devices: Sequence[str] | None = None,
    known: Sequence[DeviceInfo] | None = None,
    now: float | None = None,
    max_age_s: float = 0.0,
    keep: bool = False,
) -> dict[str, Slowness]:
    """Every device's verdict from the store: the golden cases' times since ``since`` (:func:`read_slowness`,
    :func:`judge_fleet`; :meth:`~.store.counts.Counts.case_times` says how a window reads them), and training jobs'
    ``slow`` incidents (:func:`with_training`). ``known``: every device of the store, when the caller has read them
    already (:meth:`~.store.scans.Scans.devices`).

    At fleet scale the statistic reads every (device, case) pair of the window (3.1 million at 100,000 devices and
    31 cases), which no interactive read can afford; so its verdicts can be kept in the store: ``keep`` stores what
    was computed (:meth:`~.store.summaries.Summaries.keep`, one summary per window length: ``now - since``), and
    ``max_age_s`` > 0 reads a kept summary instead of computing, when it was computed at most ``max_age_s`` before
    ``now`` over a window of the same length with the same ``settings`` (each verdict's ``judged_at`` says when).
    Training incidents are always read live. ``sdcguard db refresh`` and every fleet policy run keep them."""
    s = settings or SlowSettings()
    t = time.time() if now is None else now
    verdicts = (
        _read_kept(store, _window(since, t), s, t, max_age_s, None if devices is None else set(devices))
        if max_age_s > 0
        else None
    )
    if verdicts is None:
        inputs = read_slowness(store, since=since, settings=s, known=known)
        known = inputs.known
        verdicts = judge_fleet(inputs, s)
        if keep:
            keep_verdicts(store, verdicts, since=since, now=t, settings=s)
    if devices is None and known is None:
        known = store.scans.devices()
    wanted = {d.id for d in known} if devices is None and known is not None else set(devices or ())
    return with_training(verdicts, store.training.incidents(since=since), wanted=wanted)


def keep_verdicts(
    store: Store,
    verdicts: Mapping[str, Slowness],
    *,
    since: float | None,
    now: float,
    settings: SlowSettings | None = None,
) -> None:
    """Keep ``verdicts``, judged at ``now`` over the window from ``since`` with ``settings``, in the store (replacing
    those kept for a window of that length): what :func:`kept_verdicts` and :func:`fleet_slowness` read back."""
    s = settings or SlowSettings()
    store.summaries.keep(_kept_name(_window(since, now)), _summary(verdicts, s, now))


def kept_verdicts(
    store: Store, *, since: float | None, now: float, settings: SlowSettings | None = None, max_age_s: float
) -> dict[str, Slowness] | None:
    """The verdicts kept for a window as long as ``now - since`` with ``settings``, if judged at most ``max_age_s``
    before ``now``, each with its ``judged_at``; None when there are none such (or they cannot be read)."""
    return _read_kept(store, _window(since, now), settings or SlowSettings(), now, max_age_s)


def _summary(verdicts: Mapping[str, Slowness], s: SlowSettings, now: float) -> dict[str, object]:
    """The kept form of ``verdicts``: one column per field, numbers as the bytes of float64 arrays (base64, None as
    a mask beside them), text as its distinct values and the bytes of a uint32 index, so reading 100,000 devices back
    parses a few strings instead of a million numbers and sentences, and every value comes back to the bit."""
    rows = list(verdicts.values())
    names = sorted({f for v in rows for f in v.families})
    columns: dict[str, object] = {"device": [v.device for v in rows]}
    columns.update((f, _pack_text([getattr(v, f) for v in rows])) for f in _KEPT_TEXT)
    columns.update((f, _pack([getattr(v, f) for v in rows])) for f in _KEPT_NUMBERS)
    columns["slow"] = _pack([float(v.slow) for v in rows])
    columns["families"] = {name: _pack([v.families.get(name) for v in rows]) for name in names}
    return {"format": _KEPT_FORMAT, "at": now, "settings": dataclasses.asdict(s), "columns": columns}


def _pack(values: Sequence[float | None]) -> dict[str, str]:
    none = np.fromiter((x is None for x in values), bool, len(values))
    array = np.fromiter((math.nan if x is None else x for x in values), np.float64, len(values))
    return {"f8": base64.b64encode(array.astype("<f8").tobytes()).decode(), "none": _bits(none)}


def _pack_text(values: Sequence[str | None]) -> dict[str, object]:
    distinct = {v: i for i, v in enumerate(dict.fromkeys(values))}
    index = np.fromiter((distinct[v] for v in values), "<u4", len(values))
    return {"values": list(distinct), "u4": base64.b64encode(index.tobytes()).decode()}


def _unpack_text(packed: Mapping[str, Any], n: int) -> list[Any]:
    values = packed["values"]
    if not isinstance(values, list):
        raise ValueError(f"a kept text column's values are a {type(values).__name__}, not a list")
    index = np.frombuffer(base64.b64decode(packed["u4"], validate=True), "<u4")
    if len(index) != n:
        raise ValueError(f"a kept column of {len(index)} values for {n} devices")
    if n and int(index.max()) >= len(values):
        raise ValueError(f"a kept text column indexes value {int(index.max())} of {len(values)}")
    return [values[i] for i in index.tolist()]


def _bits(mask: np.ndarray) -> str:
    return base64.b64encode(np.packbits(mask).tobytes()).decode()


def _unpack(packed: Mapping[str, str], n: int) -> list[float | None]:
    values = np.frombuffer(base64.b64decode(packed["f8"], validate=True), "<f8")
    none = np.unpackbits(np.frombuffer(base64.b64decode(packed["none"], validate=True), np.uint8), count=n).astype(bool)
    if len(values) != n:
        raise ValueError(f"a kept column of {len(values)} values for {n} devices")
    out: list[float | None] = values.tolist()
    for i in np.flatnonzero(none).tolist():
        out[i] = None
    return out


def _read_kept(
    store: Store, window_s: float | None, s: SlowSettings, now: float, max_age_s: float, wanted: set[str] | None = None
) -> dict[str, Slowness] | None:
    """The kept verdicts for a window of ``window_s`` seconds under settings ``s``, if computed at most
    ``max_age_s`` before ``now`` (None otherwise: compute them). A summary that cannot be read (written by hand, cut
    short) is ignored with a warning: the verdicts are derived data, computed again."""
    name = _kept_name(window_s)
    try:
        kept = store.summaries.kept(name)
        if kept is None or kept.get("format") != _KEPT_FORMAT or kept.get("settings") != dataclasses.asdict(s):
            return None
        at = float(kept["at"])
        if not 0 <= now - at <= max_age_s:
            return None
        return _verdicts(kept["columns"], at, s, wanted)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # binascii.Error and JSON's errors are ValueErrors
        _log.warning(
            "the kept summary %s of %s cannot be read (%s: %s); computing the verdicts",
            name,
            store.path,
            type(e).__name__,
            e,
        )
        return None


def _verdicts(c: Mapping[str, Any], at: float, s: SlowSettings, wanted: set[str] | None) -> dict[str, Slowness]:
    """The verdicts of a kept summary's ``columns``, computed at ``at`` (only those of ``wanted`` devices)."""
    n = len(c["device"])
    ids = list(c["device"])
    pick = None if wanted is None else [i for i, d in enumerate(ids) if d in wanted]

    def only(values: list[Any]) -> list[Any]:
        return values if pick is None else [values[i] for i in pick]

    text = {f: only(_unpack_text(c[f], n)) for f in _KEPT_TEXT}
    number = {f: only(_unpack(c[f], n)) for f in _KEPT_NUMBERS}
    slow = [x == 1.0 for x in only(_unpack(c["slow"], n))]
    names = list(c["families"])
    columns = [only(_unpack(c["families"][name], n)) for name in names]
    ids = only(ids)
    # a device's slowdown per family it was compared in (most devices: every family, one dict(zip) each)
    families = (
        [
            dict(zip(names, xs)) if None not in xs else {k: x for k, x in zip(names, xs) if x is not None}
            for xs in zip(*columns)
        ]
        if names
        else [{} for _ in ids]
    )
    return {
        d: Slowness(
            device=d,
            slow=is_slow,
            slowdown=x,
            slowdown_low=lo,
            basis=basis,
            confidence=sure,
            peers=int(peers or 0),
            cases=int(cases or 0),
            history=hist,
            families=fam,
            threshold=threshold if threshold is not None else s.threshold,
            reason=why,
            judged_at=at,
        )
        for d, basis, sure, why, x, lo, hist, threshold, peers, cases, is_slow, fam in zip(
            ids, *(text[f] for f in _KEPT_TEXT), *(number[f] for f in _KEPT_NUMBERS), slow, families
        )
    }
