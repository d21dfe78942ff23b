"""Prometheus export: a node-exporter textfile-collector file with one series per device.

Labels follow the DCGM exporter, so sdcguard series join dashboards built for it: ``gpu`` (the device's index
on its host: NVML index, CPU core, simulated device number), ``UUID`` (the device id: ``GPU-<uuid>`` for a GPU),
``Hostname``, ``modelName`` (empty where the model is unknown); plus ``device`` (the sdcguard id) and ``kind``.
Every series of every per-device metric carries exactly these (:data:`LABELS`; ``sdcguard_device_status`` adds
``status``), so series of one device always match on all of them; ``sdcguard_breaker_trips_total`` is the
fleet's, with none. Ratios end in ``_ratio`` (Prometheus naming).
The file is written to a temporary file in the same directory and renamed over the target
(:func:`.files.write_atomic`), so the collector never reads half a file.

Counters (``*_total``) cover all time; rates and bounds too; ``sdcguard_device_status`` is 1 for the device's
current status (``suspect``: a failure in the last ``suspect_window_s``).
"""

from __future__ import annotations

import time
from pathlib import Path

from ...durations import DEFAULT_WINDOW_S
from ..store.store import Store
from .devices import DeviceReport, build_report
from .files import write_atomic

__all__ = ["render_textfile", "write_textfile", "render_spools", "LABELS", "METRICS", "SPOOL_METRICS"]

LABELS = ("gpu", "UUID", "Hostname", "modelName", "device", "kind")
"""The labels of every series, in this order."""
METRICS = (
    "sdcguard_executions_total",
    "sdcguard_failures_total",
    "sdcguard_test_seconds_total",
    "sdcguard_failure_ratio",
    "sdcguard_failure_ratio_lower",
    "sdcguard_failure_ratio_upper",
    "sdcguard_last_scan_timestamp_seconds",
    "sdcguard_device_status",
    "sdcguard_device_slow",
    "sdcguard_slowdown_ratio",
    "sdcguard_training_incidents_total",
    "sdcguard_breaker_trips_total",
)
"""Every metric the textfile holds (``sdcguard_breaker_trips_total`` has no labels: the breaker is the fleet's)."""
SPOOL_METRICS = (
    "sdcguard_spool_pending_scans",
    "sdcguard_spool_pending_incidents",
    "sdcguard_spool_oldest_pending_timestamp_seconds",
    "sdcguard_spool_last_forward_timestamp_seconds",
)
"""The metrics of a node's spools (:func:`render_spools`), labelled ``Hostname`` and ``spool`` (its file)."""

_STATUSES = ("healthy", "suspect", "quarantined", "probation")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(r: DeviceReport, **extra: str) -> str:
    values = ("" if r.index is None else str(r.index), r.device, r.host, r.model or "", r.device, r.kind)
    pairs = {**dict(zip(LABELS, values, strict=True)), **extra}
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _num(v: float | int | None) -> str:
    return "NaN" if v is None else repr(float(v))


_Metric = tuple[str, str, str, list[tuple[str, float | int | None]]]
"""(name, type, help, its samples: (labels, value))."""


def render_textfile(
    store: Store, *, now: float | None = None, suspect_window_s: float = DEFAULT_WINDOW_S, slow_max_age_s: float = 0.0
) -> str:
    """The textfile's content. ``slow_max_age_s``: as :func:`~.devices.build_report`'s (the slowness verdicts are
    those of the suspect window)."""
    t = time.time() if now is None else now
    rows = build_report(store, since=None, suspect_since=t - suspect_window_s, now=t, slow_max_age_s=slow_max_age_s)
    incidents: dict[str, int] = {}
    for i in store.training.incidents():
        for d in i.devices or ((i.device,) if i.device else ()):
            incidents[d] = incidents.get(d, 0) + 1
    trips = sum(1 for d in store.quarantine.decisions() if d.decision in ("breaker", "training_breaker"))
    metrics: list[_Metric] = [
        *_scan_metrics(rows),
        (
            "sdcguard_training_incidents_total",
            "counter",
            "Training incidents naming the device (any check: replay, checksums, weights, slow).",
            [(_labels(r), incidents.get(r.device, 0)) for r in rows],
        ),
        (
            "sdcguard_breaker_trips_total",
            "counter",
            "Policy runs in which a circuit breaker tripped (the golden suite's or the training incidents').",
            [("", trips)],
        ),
    ]
    lines = []
    for name, kind, help_text, samples in metrics:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {_num(value)}" for labels, value in samples)
    return "\n".join(lines) + "\n"


def _scan_metrics(rows: list[DeviceReport]) -> list[_Metric]:
    """The metrics of each device's report row: the golden suite's counts, rates, status and slowness."""
    return [
        (
            "sdcguard_executions_total",
            "counter",
            "Golden-case executions (first attempts) on the device.",
            [(_labels(r), r.overall.executions) for r in rows],
        ),
        (
            "sdcguard_failures_total",
            "counter",
            "Executions whose output differed from the golden in at least one bit.",
            [(_labels(r), r.overall.failures) for r in rows],
        ),
        (
            "sdcguard_test_seconds_total",
            "counter",
            "Seconds of golden-case testing on the device.",
            [(_labels(r), r.overall.test_hours * 3600.0) for r in rows],
        ),
        (
            "sdcguard_failure_ratio",
            "gauge",
            "Failed executions / executions.",
            [(_labels(r), r.overall.rate) for r in rows],
        ),
        (
            "sdcguard_failure_ratio_lower",
            "gauge",
            "One-sided Clopper-Pearson lower bound of the failure ratio (95%).",
            [(_labels(r), r.overall.rate_low) for r in rows],
        ),
        (
            "sdcguard_failure_ratio_upper",
            "gauge",
            "One-sided Clopper-Pearson upper bound of the failure ratio (95%).",
            [(_labels(r), r.overall.rate_high) for r in rows],
        ),
        (
            "sdcguard_last_scan_timestamp_seconds",
            "gauge",
            "Unix time the device's last complete scan finished.",
            [(_labels(r), r.last_scan) for r in rows if r.last_scan is not None],
        ),
        (
            "sdcguard_device_status",
            "gauge",
            "1 for the device's current status (healthy, suspect, quarantined, probation).",
            [(_labels(r, status=s), int(r.status == s)) for r in rows for s in _STATUSES],
        ),
        (
            "sdcguard_device_slow",
            "gauge",
            "1 when the device is slower than its peers on the same golden cases "
            "(beside its status: a slow device can be healthy).",
            [(_labels(r), int(bool(r.slowness and r.slowness.slow))) for r in rows],
        ),
        (
            "sdcguard_slowdown_ratio",
            "gauge",
            "The device's time for the golden cases / its peers' median time.",
            [(_labels(r), r.slowness.slowdown) for r in rows if r.slowness and r.slowness.slowdown is not None],
        ),
    ]


def write_textfile(store: Store, path: Path, *, now: float | None = None, slow_max_age_s: float = 0.0) -> int:
    """Write the textfile atomically (temp file in the same directory, then rename); returns the device count."""
    text = render_textfile(store, now=now, slow_max_age_s=slow_max_age_s)
    write_atomic(path, text)
    return text.count("sdcguard_executions_total{")


def render_spools(spools: list[Path], *, host: str) -> str:
    """A node's textfile of its spools' backlogs (:attr:`~..store.maintenance.Maintenance.backlog`): what waits
    for a server that could not be reached, and since when (an alert fires when it waits an hour)."""
    from ..store.store import Store

    backlogs = []
    for path in spools:
        with Store.open(path, readonly=True) as spool:
            backlogs.append((path, spool.maintenance.backlog))
    metrics = [
        ("sdcguard_spool_pending_scans", "Scans in the spool not yet forwarded to its server.", "scans"),
        ("sdcguard_spool_pending_incidents", "Training incidents in the spool not yet forwarded.", "incidents"),
        ("sdcguard_spool_oldest_pending_timestamp_seconds", "Unix time the oldest of them was written.", "oldest"),
        ("sdcguard_spool_last_forward_timestamp_seconds", "Unix time the spool was last forwarded.", "last_forward"),
    ]
    lines = []
    for name, help_text, field in metrics:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for path, b in backlogs:
            value = getattr(b, field)
            if value is not None:
                labels = f'{{Hostname="{_escape(host)}",spool="{_escape(str(path))}"}}'
                lines.append(f"{name}{labels} {_num(value)}")
    return "\n".join(lines) + "\n"
