"""NVML as a second opinion (:mod:`sdcguard.fleet.nvml`): the XIDs and ECC counts the scanner's telemetry read
around each GPU scan, shown by ``sdcguard report`` beside each GPU (table, JSON, CSV, HTML; nothing new for a CPU
fleet), kept reports that stay equal to computed ones, and ``[policy] nvml_errors`` (off by default) quarantining a
GPU whose scans in the window after its last release saw a hardware event. On SQLite and on the PostgreSQL server the
tests start."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.durations import DAY_S
from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.nvml import HARDWARE_XIDS, hardware_events, nvml_text
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy, decide, read_inputs
from sdcguard.fleet.report.devices import build_report
from sdcguard.fleet.report.kept import ReportLines, keep_report, kept_lines
from sdcguard.fleet.store.rows import NvmlScan
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, gpu_scan, nvml_snapshot, result, scan
from tests.conftest import BACKENDS

GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
HOUR = 3600.0
ON = QuarantinePolicy(nvml_errors=True)


def _scan(**readings: object) -> NvmlScan:
    return NvmlScan(device=GPU0, scan=1, time=NOW, **readings)


@pytest.mark.parametrize(
    "readings, events, text",
    [
        ({}, (), "ok"),
        ({"xids": (79,)}, ("XID 79",), "xid 79"),
        ({"xids": (13, 43, 13)}, (), "xid 13 (not counted), xid 43 (not counted)"),
        ({"xids": (31, 94)}, ("XID 94",), "xid 94, xid 31 (not counted)"),
        ({"dbe_growth": 2, "uncorrectable_rows_growth": 0}, ("DBE +2",), "dbe +2"),
        ({"uncorrectable_rows_growth": 1}, ("uncorrectable remapped rows +1",), "uncorrectable remapped rows +1"),
        ({"remap_failure": True, "remap_pending": True}, ("remap failure",), "remap failure"),
        ({"remap_failure": False, "dbe_growth": 0}, (), "ok"),
    ],
)
def test_what_counts_and_how_it_is_said(readings: dict[str, object], events: tuple[str, ...], text: str) -> None:
    assert hardware_events(_scan(**readings)) == events
    assert nvml_text(_scan(**readings)) == text


def test_the_applications_xids_are_never_the_hardwares() -> None:
    assert HARDWARE_XIDS.isdisjoint({13, 31, 43, 45, 68}) and {48, 79, 94, 95} <= HARDWARE_XIDS


def _run(db: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["--db", db, *args])
    return r.exit_code, r.output


def test_the_report_shows_each_gpus_latest_scan_beside_it(store_db: str, tmp_path: Path) -> None:
    with Store.open(store_db) as store:
        gpu_scan(store, GPU0, t=NOW - 2 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[13]))
        gpu_scan(store, GPU0, t=NOW - HOUR, before=nvml_snapshot(dbe=1), after=nvml_snapshot(dbe=3, xids=[79]))
        gpu_scan(store, GPU1, t=NOW - HOUR, before=nvml_snapshot(), after=nvml_snapshot())
        scan(store, "cpu:node1:0", [result("cpu:node1:0")])
    code, out = _run(store_db, "report", "--format", "json", "--since", "all")
    rows = {r["device"]: r for r in json.loads(out)}
    assert code == 0 and rows["cpu:node1:0"]["nvml"] is None, out
    g0 = rows[GPU0]["nvml"]
    assert g0["text"] == "xid 79, dbe +2" and g0["xids"] == [79] and g0["hardware_xids"] == [79]
    assert (g0["dbe_growth"], g0["ecc_dbe_aggregate"], g0["remap_failure"], g0["retired_pages_sbe"]) == (
        2,
        3,
        False,
        None,
    )
    assert g0["scan_started"] == "2027-01-15T07:00:00Z" and rows[GPU1]["nvml"]["text"] == "ok"
    assert rows[GPU0]["executions"] == 2 and rows[GPU0]["failures"] == 0  # a second opinion moves no golden rate
    code, out = _run(store_db, "report", "--since", "all")
    assert code == 0 and "nvml" in out and "xid 79, dbe +2" in out, out
    code, out = _run(store_db, "report", "--since", "all", "--format", "csv")
    table = {r["device"]: r for r in csv.DictReader(io.StringIO(out))}
    assert table[GPU0]["nvml"] == "xid 79, dbe +2" and table["cpu:node1:0"]["nvml"] == "", out
    page = tmp_path / "report.html"
    code, out = _run(store_db, "report", "--since", "all", "--html", str(page))
    assert code == 0 and ">nvml<" in page.read_text() and "xid 79, dbe +2" in page.read_text(), out


def test_a_cpu_fleets_table_and_page_are_as_they_were(tmp_path: Path) -> None:
    db = str(tmp_path / "f.db")
    with Store.open(db) as store:
        scan(store, "cpu:node1:0", [result("cpu:node1:0")])
    code, out = _run(db, "report", "--since", "all")
    assert code == 0 and "nvml" not in out and "dcgm" not in out, out
    page = tmp_path / "report.html"
    assert _run(db, "report", "--since", "all", "--html", str(page))[0] == 0 and "nvml" not in page.read_text()


def test_a_kept_report_equals_the_computed_one_as_gpus_scan_and_merge(tmp_path: Path) -> None:
    node, fleet = str(tmp_path / "node.db"), str(tmp_path / "fleet.db")
    with Store.open(node) as store:
        gpu_scan(store, GPU1, t=NOW - 3 * HOUR, before=nvml_snapshot(), after=nvml_snapshot())
        running = store.scans.begin(
            device=GPU0, host="node1", budget_s=60.0, started_at=NOW - HOUR, meta={"telemetry_before": nvml_snapshot()}
        )
    merge_stores(fleet, [Path(node)])
    with Store.open(fleet) as store:
        keep_report(store, since=NOW - 2 * DAY_S, now=NOW, slow_max_age_s=1.0)
    with Store.open(node) as store:  # the scan that was running at the last merge ends with an XID
        store.scans.record(
            running, [result(GPU0, t=NOW - HOUR)], finish="error", meta={"telemetry_after": nvml_snapshot(xids=[79])}
        )
    merge_stores(fleet, [Path(node)])
    with Store.open(fleet) as store:
        gpu_scan(store, GPU1, t=NOW - 10, before=nvml_snapshot(), after=nvml_snapshot(failure=True))
        kept = kept_lines(store, since=NOW + 60 - 2 * DAY_S, now=NOW + 60, slow_max_age_s=3600.0)
        computed = ReportLines.of(build_report(store, since=NOW + 60 - 2 * DAY_S, now=NOW + 60, slow_max_age_s=3600.0))
        assert kept is not None and kept.json() == computed.json()
        assert {r["device"]: r["nvml"]["text"] for r in json.loads(kept.json())} == {
            GPU0: "xid 79",
            GPU1: "remap failure",
        }


def test_the_rule_is_off_by_default_and_a_release_ends_its_evidence(store_db: str) -> None:
    with Store.open(store_db) as store:
        gpu_scan(store, GPU0, t=NOW - 2 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[79]))
        gpu_scan(store, GPU1, t=NOW - 2 * HOUR, before=nvml_snapshot(), after=nvml_snapshot(xids=[13, 31, 43, 45]))
        assert apply_policy(store, QuarantinePolicy(), now=NOW).quarantined == []  # off by default
        decided = apply_policy(store, ON, now=NOW)
        assert decided.quarantined == [GPU0], decided.reasons
        assert decided.reasons[0] == (
            f"{GPU0}: NVML: XID 79 during the scan started 2027-01-15T06:00:00Z (nvml_errors is on)"
        ), decided.reasons
        store.quarantine.release(GPU0, reason="reseated", now=NOW + 60)
        assert apply_policy(store, ON, now=NOW + 120).quarantined == []
        gpu_scan(store, GPU0, t=NOW + 180, before=nvml_snapshot(dbe=0), after=nvml_snapshot(dbe=1, failure=True))
        decided = apply_policy(store, ON, now=NOW + 300)
        assert decided.quarantined == [GPU0] and "NVML: DBE +1, remap failure during" in decided.reasons[0]


# --- the property: quarantined by the rule iff a scan in the window after its last release saw a hardware event ---
DEVICES = (GPU0, GPU1)
WINDOW_S = 10 * HOUR
KINDS = {
    "clean": (nvml_snapshot(), nvml_snapshot()),
    "xid79": (nvml_snapshot(), nvml_snapshot(xids=[79])),
    "xid13": (nvml_snapshot(), nvml_snapshot(xids=[13, 43])),
    "dbe": (nvml_snapshot(dbe=1), nvml_snapshot(dbe=2)),
    "rows": (nvml_snapshot(rows=0), nvml_snapshot(rows=1)),
    "failure": (nvml_snapshot(), nvml_snapshot(failure=True)),
    "garbage": ("x", {"xids": "79", "ecc_dbe_volatile": "2", "remap_failure": "yes"}),
    "partial": ({"time": 1.0}, {"xids": [94]}),
}
"""A scan's telemetry before and after it, by what it saw."""
HARDWARE = {"xid79", "dbe", "rows", "failure", "partial"}

_op = st.one_of(
    st.tuples(st.just("scan"), st.sampled_from(DEVICES), st.sampled_from(sorted(KINDS))),
    st.tuples(st.just("drill"), st.sampled_from(DEVICES), st.sampled_from(sorted(HARDWARE))),
    st.tuples(st.just("release"), st.sampled_from(DEVICES), st.just("")),
    st.tuples(st.just("wait"), st.just(""), st.sampled_from(["1", "4", "9"])),
    st.tuples(st.just("policy"), st.just(""), st.just("")),
)
XID_THEN_RELEASED = [("scan", GPU0, "xid79"), ("policy", "", ""), ("release", GPU0, ""), ("policy", "", "")]
OUT_OF_THE_WINDOW = [("scan", GPU1, "dbe"), ("wait", "", "9"), ("wait", "", "4"), ("policy", "", "")]
DRILL_AND_APPLICATION = [
    ("drill", GPU0, "xid79"),
    ("scan", GPU1, "xid13"),
    ("scan", GPU1, "garbage"),
    ("policy", "", ""),
]


@pytest.mark.parametrize("backend", BACKENDS)
@example(ops=XID_THEN_RELEASED)
@example(ops=OUT_OF_THE_WINDOW)
@example(ops=DRILL_AND_APPLICATION)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=14))
def test_the_rule_quarantines_a_gpu_iff_a_scan_in_the_window_after_its_release_saw_a_hardware_event(
    backend: str, new_store: Callable[[str], str], ops: list[tuple[str, str, str]]
) -> None:
    policy = QuarantinePolicy(nvml_errors=True, window_s=WINDOW_S)
    seen: dict[str, list[float]] = {d: [] for d in DEVICES}  # when each GPU's scans saw a hardware event
    released: dict[str, float] = {}
    clock = NOW
    with Store.open(new_store(backend)) as store:
        for kind, device, how in ops:
            clock += HOUR
            if kind in ("scan", "drill"):
                before, after = KINDS[how]
                gpu_scan(
                    store, device, t=clock, before=before, after=after, inject="gpu:0:flip" if kind == "drill" else None
                )
                if kind == "scan" and how in HARDWARE:
                    seen[device].append(clock)
            elif kind == "release":
                if store.quarantine.states().get(device) != "quarantined":
                    store.quarantine.add(device, reason="by hand", now=clock)
                store.quarantine.release(device, reason="reseated", now=clock)
                released[device] = clock
            elif kind == "wait":
                clock += float(how) * HOUR
            else:
                now = clock + 120
                states = store.quarantine.states()
                want = {
                    d
                    for d, times in seen.items()
                    if states.get(d) != "quarantined"
                    and any(t >= now - WINDOW_S and t >= released.get(d, float("-inf")) for t in times)
                }
                verdict = decide(read_inputs(store, policy, now=now, devices=None, scope="fleet"), policy)
                assert set(verdict.quarantine) == want, (ops, verdict.quarantine, seen, released)
                assert all("(nvml_errors is on)" in why for why in verdict.quarantine.values())
                off = decide(
                    read_inputs(store, QuarantinePolicy(window_s=WINDOW_S), now=now, devices=None, scope="fleet"),
                    QuarantinePolicy(window_s=WINDOW_S),
                )
                assert off.quarantine == {}
                assert set(apply_policy(store, policy, now=now).quarantined) == want
