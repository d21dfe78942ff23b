"""``store.hardware``: NVML's readings of each GPU around its scans, read back from the scans' meta as the scanner
wrote them, on SQLite and on the PostgreSQL server the tests start: each GPU's latest finished scan for the report,
the scans of a window that saw an event for the policy, fire drills and CPU cores never; a merge carries them; a
meta that holds anything else never raises."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.store.diagnostics import nvml_scan
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, gpu_scan, nvml_snapshot, result, scan

GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
HOUR = 3600.0


def test_each_gpus_latest_finished_scan_is_read_whatever_its_status(store_db: str) -> None:
    with Store.open(store_db) as store:
        gpu_scan(store, GPU0, t=NOW - 5 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[79]))
        gpu_scan(store, GPU0, t=NOW - 4 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(dbe=2), status="error")
        # later ones that do not speak: a drill's, a scan still running (no telemetry after it yet)
        gpu_scan(store, GPU0, t=NOW - 3 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(), inject="gpu:0:flip")
        store.scans.begin(device=GPU0, host="node1", budget_s=60.0, started_at=NOW - 2 * HOUR, meta={})
        gpu_scan(store, GPU1, t=NOW - 2 * HOUR, before=nvml_snapshot(rows=1), after=nvml_snapshot(rows=1))
        scan(store, "cpu:node1:0", [result("cpu:node1:0")])  # a CPU core: no NVML reading
        latest = store.hardware.latest()
        assert latest.keys() == {GPU0, GPU1}
        assert latest[GPU0].time == NOW - 4 * HOUR and latest[GPU0].dbe_growth == 2 and latest[GPU0].xids == ()
        g1 = latest[GPU1]
        assert (g1.uncorrectable_rows_growth, g1.remapped_rows_uncorrectable, g1.ecc_sbe_aggregate) == (0, 1, 7)
        assert g1.remap_failure is False and g1.remap_pending is False and g1.retired_pages_sbe is None
        assert store.hardware.latest([GPU1]).keys() == {GPU1} and store.hardware.latest(["cpu:node1:0"]) == {}


def test_the_events_of_a_window_leave_out_quiet_scans_drills_and_older_ones(store_db: str) -> None:
    with Store.open(store_db) as store:
        gpu_scan(store, GPU0, t=NOW - 30 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[79]))
        gpu_scan(store, GPU0, t=NOW - 5 * HOUR, before=nvml_snapshot(), after=nvml_snapshot())
        gpu_scan(store, GPU0, t=NOW - 4 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[13]))
        gpu_scan(store, GPU1, t=NOW - 3 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(failure=True))
        gpu_scan(store, GPU1, t=NOW - 2 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[48]), inject="x")
        gpu_scan(store, GPU1, t=NOW - HOUR, before=nvml_snapshot(dbe=1), after=nvml_snapshot(dbe=3, rows=2))
        seen = store.hardware.events(since=NOW - 24 * HOUR)
        assert [(r.device, r.time) for r in seen] == [
            (GPU0, NOW - 4 * HOUR),
            (GPU1, NOW - 3 * HOUR),
            (GPU1, NOW - HOUR),
        ]
        assert (
            seen[0].xids == (13,)
            and seen[1].remap_failure
            and (seen[2].dbe_growth, seen[2].uncorrectable_rows_growth) == (2, 2)
        )
        assert [r.device for r in store.hardware.events(since=NOW - 24 * HOUR, devices=[GPU0])] == [GPU0]


def test_a_merge_carries_the_readings_into_the_fleet_store(tmp_path: Path, store_db: str) -> None:
    node = tmp_path / "node.db"
    with Store.open(node) as store:
        gpu_scan(store, GPU0, t=NOW - HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[79]))
    merge_stores(store_db, [node])
    with Store.open(store_db) as fleet:
        assert fleet.hardware.latest()[GPU0].xids == (79,)
        assert [r.xids for r in fleet.hardware.events(since=NOW - 2 * HOUR)] == [(79,)]


_GARBAGE = [
    "not json",
    "[1, 2]",
    "null",
    json.dumps({"telemetry_after": "79"}),
    json.dumps({"telemetry_before": [79], "telemetry_after": None}),
    json.dumps({"telemetry_after": {"xids": "79", "ecc_dbe_volatile": "3", "remap_failure": 1}}),
    json.dumps({"telemetry_after": {"time": 1.0, "temperature_c": 41, "freq_mhz": 2000.0}}),  # a CPU core's
]


def test_a_meta_without_nvml_readings_reads_as_none(store_db: str) -> None:
    with Store.open(store_db) as store:
        for k, text in enumerate(_GARBAGE):
            assert nvml_scan(k, GPU0, NOW, text) is None, text
            doc = json.loads(text) if text.startswith("{") else {}
            gpu_scan(
                store, GPU0, t=NOW - HOUR + k, before=doc.get("telemetry_before"), after=doc.get("telemetry_after")
            )
        assert store.hardware.latest() == {} and store.hardware.events(since=0.0) == ()


def test_partial_readings_are_read_where_they_are_counts() -> None:
    after = {"xids": [79, "x", None, 1.5, -3, 13.0, True], "ecc_dbe_volatile": 4.0, "remap_failure": True}
    r = nvml_scan(1, GPU0, NOW, json.dumps({"telemetry_before": {"ecc_dbe_volatile": "1"}, "telemetry_after": after}))
    assert r is not None and r.xids == (79, 13) and r.dbe_growth is None and r.remap_failure is True
    r = nvml_scan(
        1,
        GPU0,
        NOW,
        json.dumps({"telemetry_before": {"ecc_dbe_volatile": 5}, "telemetry_after": {"ecc_dbe_volatile": 0}}),
    )
    assert r is not None and r.dbe_growth == 0  # the counters were reset (a driver reload): nothing grew
    assert nvml_scan(1, GPU0, NOW, '{"telemetry_after": {"ecc_dbe_volatile": NaN}}') is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["xids", "ecc_dbe_volatile", "ecc_sbe_aggregate", "remapped_rows_uncorrectable", "remap_failure", "remap_pending"]
)
_snapshot = _json | st.dictionaries(_keys, _json, max_size=6)


@settings(max_examples=300, deadline=None)
@given(before=_snapshot, after=_snapshot, extra=st.dictionaries(st.text(max_size=5), _json, max_size=3))
def test_no_meta_ever_raises(before: Any, after: Any, extra: dict[str, Any]) -> None:
    """Whatever a meta holds, reading it back gives a record of counts, or None, and never raises."""
    meta = {**extra, "telemetry_before": before, "telemetry_after": after}
    for text in (json.dumps(meta), json.dumps(meta)[:-3], meta):
        r = nvml_scan(1, GPU0, NOW, text)
        if r is not None:
            assert all(type(x) is int and x >= 0 for x in r.xids)
            for v in (r.dbe_growth, r.uncorrectable_rows_growth, r.ecc_dbe_aggregate, r.remapped_rows_uncorrectable):
                assert v is None or (type(v) is int and v >= 0 and not math.isnan(v))
            assert r.remap_failure in (None, True, False) and r.remap_pending in (None, True, False)
