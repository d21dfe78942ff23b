"""Durations as the CLI spells them, and Prometheus label escaping for any host name."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sdcguard.durations import iso_utc, parse_duration, since_timestamp
from sdcguard.errors import BadInput
from sdcguard.fleet.report.prometheus import render_textfile, write_textfile
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo
from tests._fleet import NOW, result, scan

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@given(st.integers(1, 10_000), st.sampled_from(sorted(UNITS)))
def test_durations_parse(n: int, unit: str) -> None:
    assert parse_duration(f"{n}{unit}") == n * UNITS[unit]
    assert parse_duration(f" {n}{unit.upper()} ") == n * UNITS[unit]


NEAR_A_SECOND = [0.0, 5e-7, -5e-7, 0.4999995, 0.9999994999, 0.9999995, 0.99999949999, 1 - 1e-7, 0.5]
"""Fractions where rounding to microseconds decides the second (half of a microsecond either way)."""


@given(
    st.one_of(
        st.floats(-2e9, 4e9, allow_nan=False),
        st.builds(lambda s, f: s + f, st.integers(-2 * 10**9, 4 * 10**9), st.sampled_from(NEAR_A_SECOND)),
    )
)
@settings(max_examples=2000)
def test_iso_utc_writes_what_datetime_writes(t: float) -> None:
    assert iso_utc(t) == datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("text", ["banana", "", "7", "d7", "-3d", "0d", "7 days", "1e3s"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(BadInput, match="e.g. 30m, 12h, 7d"):
        parse_duration(text)


def test_since_all_and_default() -> None:
    assert since_timestamp("all", now=NOW) is None
    assert since_timestamp(None, now=NOW) == NOW - 7 * 86400


@settings(max_examples=30)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20))
def test_any_host_name_survives_the_textfile(tmp_path_factory: pytest.TempPathFactory, host: str) -> None:
    with Store.open(tmp_path_factory.mktemp("prom") / "s.db") as store:
        store.scans.record_devices([DeviceInfo(id="sim:3", host=host, kind="sim", model='A"100\\x')], now=NOW)
        scan(store, "sim:3", [result("sim:3", t=NOW - 10)], host=host)
        text = render_textfile(store, now=NOW)
    samples = {f.name: f.samples for f in text_string_to_metric_families(text)}
    (s,) = samples["sdcguard_executions"]
    assert s.labels["Hostname"] == host and s.labels["modelName"] == 'A"100\\x' and s.value == 1


def test_every_series_carries_the_same_documented_labels(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from sdcguard.fleet.report.prometheus import LABELS, METRICS

    with Store.open(tmp_path / "s.db") as store:
        store.scans.record_devices([DeviceInfo(id="sim:1", host="h", kind="sim", model="A100")], now=NOW)
        scan(store, "sim:1", [result("sim:1", t=NOW - 10)])
        scan(store, "sim:2", [result("sim:2", t=NOW - 10)])  # no model known
        text = render_textfile(store, now=NOW)
    families = list(text_string_to_metric_families(text))
    names = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    assert names == set(METRICS)
    assert "sdcguard_failure_rate" not in text  # ratios end in _ratio
    for f in families:
        for s in f.samples:
            if f.name == "sdcguard_breaker_trips":  # the fleet's breaker: one series, no device
                assert s.labels == {} and s.value == 0
                continue
            extra = {"status"} if f.name == "sdcguard_device_status" else set()
            assert set(s.labels) == set(LABELS) | extra, (f.name, s.labels)
    models = {s.labels["device"]: s.labels["modelName"] for f in families for s in f.samples if s.labels}
    assert models == {"sim:1": "A100", "sim:2": ""}
    page = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    assert all(f"`{m}`" in page for m in METRICS) and all(f"`{label}`" in page for label in LABELS)


def test_textfile_replaces_atomically(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        scan(store, "sim:1", [result("sim:1", t=NOW - 10)])
        target = tmp_path / "out.prom"
        target.write_text("stale\n")
        inode = target.stat().st_ino
        assert write_textfile(store, target, now=NOW) == 1
    assert target.stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert target.stat().st_mode & 0o777 == 0o644
    assert "stale" not in target.read_text()
