"""Fleet scanner parts: discovery, device locks, idle detection, batched recording."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_scan.device_scan.record import ScanRecorder
from fleet_scan.device_scan.summary import DeviceSummary
from fleet_scan.devices.discovery import ScanTarget, discover_cpus, select_targets
from fleet_scan.devices.idle import DeviceLock, DeviceLocked, IdleMonitor, read_cpu_times
from fleet_scan.devices.telemetry import telemetry_for
from sdcguard.devices import cpu_id, hostname
from sdcguard.errors import BadInput, NoDevice
from sdcguard.fleet.store.store import Store
from sdcguard.records import CaseResult, DeviceInfo

_UUID = "GPU-12345678-1234-1234-1234-123456789abc"


def _gpu(i: int, uuid: str = _UUID) -> ScanTarget:
    return ScanTarget(info=DeviceInfo(id=uuid, host=hostname(), kind="gpu", model="H200"), index=i, driver="550")


def _cpu(core: int) -> ScanTarget:
    return ScanTarget(info=DeviceInfo(id=cpu_id(core), host=hostname(), kind="cpu"), index=core)


def test_default_is_every_gpu_else_every_core() -> None:
    gpus, cpus = [_gpu(0)], [_cpu(0), _cpu(1)]
    assert select_targets([], gpus=gpus, cpus=cpus) == gpus
    assert select_targets([], gpus=[], cpus=cpus) == cpus
    assert select_targets(["all"], gpus=gpus, cpus=cpus) == gpus + cpus
    assert select_targets(["cpu:1", "cpu:1", cpu_id(0)], gpus=gpus, cpus=cpus) == [cpus[1], cpus[0]]
    assert select_targets(["cuda:0"], gpus=gpus, cpus=cpus) == gpus
    assert select_targets([_UUID.upper().replace("GPU-", "GPU-")], gpus=gpus, cpus=cpus) == gpus


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("cuda:3", "no GPU cuda:3"),
        ("cpu:9", "no CPU core cpu:9"),
        ("sim:4", "simulated"),
        ("cpu:otherhost:0", "otherhost"),
    ],
)
def test_no_matching_device_says_why(spec: str, words: str) -> None:
    with pytest.raises(NoDevice, match=words):
        select_targets([spec], gpus=[_gpu(0)], cpus=[_cpu(0)])


def test_bad_spec_is_bad_input() -> None:
    with pytest.raises(BadInput):
        select_targets(["banana"], gpus=[], cpus=[_cpu(0)])


def test_cpus_follow_the_affinity_mask() -> None:
    cores = sorted(os.sched_getaffinity(0))
    found = discover_cpus()
    assert [t.index for t in found] == cores
    assert all(t.device == cpu_id(t.index) and t.kind == "cpu" for t in found)


def test_target_round_trips_through_json() -> None:
    for t in (_gpu(2), _cpu(1)):
        assert ScanTarget.from_json(t.to_json()) == t


def test_cpu_telemetry_has_a_timestamp_and_what_proc_gives() -> None:
    snap = telemetry_for(_cpu(sorted(os.sched_getaffinity(0))[0])).snapshot()
    assert snap["time"] > 0
    assert "loadavg_1m" in snap


def test_read_cpu_times_parses_per_core_lines() -> None:
    text = "cpu  10 0 10 100 5 0 0 0 0 0\ncpu0 4 0 6 50 2 0 0 0 0 0\ncpu1 6 0 4 50 3 0 0 0 0 0\nintr 1 2\n"
    assert read_cpu_times(text) == {0: (10, 62), 1: (10, 63)}


def test_lock_keeps_a_second_scanner_out_and_dies_with_its_holder(tmp_path: Path) -> None:
    device = cpu_id(0)
    with DeviceLock(device, tmp_path):
        with pytest.raises(DeviceLocked, match="another scanner"):
            DeviceLock(device, tmp_path).acquire()
        DeviceLock(cpu_id(1), tmp_path).acquire()  # another device is free
    # a holder killed with SIGKILL never leaves the device locked: the kernel drops flock locks
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from fleet_scan.devices.idle import DeviceLock; "
        f"DeviceLock({device!r}, sys.argv[2]).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parents[2]), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(DeviceLocked, match=f"pid {holder.pid}"):
            DeviceLock(device, tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with DeviceLock(device, tmp_path):
        pass


def test_a_busy_core_is_not_idle() -> None:
    core = sorted(os.sched_getaffinity(0))[0]
    spin = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        time.sleep(0.3)
        monitor = IdleMonitor(_cpu(core), window_s=0.6, cpu_busy_max=50.0)
        reason = monitor.busy_reason()
        assert reason is not None and f"core {core}" in reason
    finally:
        spin.kill()
        spin.wait()


def _result(device: str, i: int, passed: bool = True) -> CaseResult:
    return CaseResult(
        device=device,
        case=f"alu.{i % 3}",
        family="alu",
        seed=i % 3,
        passed=passed,
        duration_s=0.001,
        started_at=1000.0 + i,
    )


@settings(max_examples=25)
@given(st.integers(1, 60), st.integers(1, 8))
def test_recorder_writes_every_result_and_the_total_lands_with_the_final_status(n: int, batch: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "s.db") as store:
        device = cpu_id(0)
        scan = store.scans.begin(device=device, host=hostname(), budget_s=1.0)
        rec = ScanRecorder(store, scan, batch=batch, flush_every_s=1e9)
        for i in range(n):
            rec.add(_result(device, i, passed=i % 7 != 3))
            # before the end the scan is running and holds whole batches (what was committed), nothing else
            row = store.scans.history()[0]
            assert row["status"] == "running" and row["total"] is None
            assert row["executions"] == rec.recorded == (i + 1) // batch * batch
        rec.finish("complete", meta={"telemetry_after": {"t": 1}})
        rows = store.scans.results(scan_id=scan)
        fails = [i for i in range(n) if i % 7 == 3]
        # one row per passing case, one per failed execution; every execution accounted for
        assert len(rows) == len({i % 3 for i in range(n) if i % 7 != 3}) + len(fails)
        assert sum(r.executions for r in rows) == n
        assert sorted(r.started_at for r in rows if not r.passed) == [1000.0 + i for i in fails]
        (row,) = store.scans.history()
        assert row["status"] == "complete" and row["total"] == n and row["failures"] == len(fails)
        assert '"telemetry_after"' in row["meta"]


def test_a_job_appearing_between_cases_is_seen() -> None:
    core = sorted(os.sched_getaffinity(0))[0]
    monitor = IdleMonitor(_cpu(core), window_s=0.0, cpu_busy_max=50.0)
    assert monitor.job_appeared() is None  # first reading: nothing to compare with yet
    spin = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        reason = None
        deadline = time.monotonic() + 10
        while reason is None and time.monotonic() < deadline:
            time.sleep(0.3)
            reason = monitor.job_appeared()
        assert reason is not None and f"core {core}" in reason
    finally:
        spin.kill()
        spin.wait()


def test_the_example_config_loads(tmp_path: Path) -> None:
    from fleet_scan.config import load_config, load_policy
    from sdcguard.fleet.actions import ActionTemplate

    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "deploy" / "sdcguard.toml")
    assert config["scan"]["budget"] == 60
    assert load_policy(config).rate_threshold == 1e-4
    assert [ActionTemplate.from_text(a).name for a in config["scan"]["actions"]] == ["slurm-drain"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nrate_treshold = 1e-4\n")
    with pytest.raises(BadInput, match="rate_treshold"):
        load_policy(load_config(bad))
    bad.write_text("[scan\n")
    with pytest.raises(BadInput, match="not valid TOML"):
        load_config(bad)


def test_simulated_fleet_goes_through_node_stores_the_merge_and_both_policies(tmp_path: Path) -> None:
    from fleet_scan.sim import DEFAULT_CASES, SimFleet, SimRun
    from sdcguard.fleet.policy import QuarantinePolicy

    fleet = SimFleet(devices=40, defective_share=0.05, p_low=0.05, p_high=0.1, transient_rate=0.0, seed=3)
    run = SimRun(tmp_path, fleet, QuarantinePolicy(), budget_s=5.0)
    defective = {f"sim:{n}" for n, p in enumerate(run.p) if p > 0}
    assert len(defective) == 2
    day0 = run.day(0)
    assert set(day0.quarantined) == defective and not day0.breaker_tripped
    assert set(day0.by_node) == defective  # reproduced, and their node's other devices passed those cases
    bad = run.day(1, bad_case=run.cases[0].id)  # every remaining device fails one case identically
    assert bad.breaker_tripped and bad.quarantined == [] and bad.by_node == []
    with Store.open(run.fleet_store, create=False) as store:
        rows = store.scans.results()
        scans = store.scans.history()
    # the scanner's rows: one per (scan, case) passing, one per failed execution or retest
    assert len(scans) == 40 + 38
    assert sum(r.executions for r in rows if not r.attempt) == day0.executions + bad.executions
    assert len([r for r in rows if r.passed and not r.attempt]) <= len(scans) * len(DEFAULT_CASES)


def test_a_simulated_batch_sharing_one_defect_is_quarantined(tmp_path: Path) -> None:
    from fleet_scan.sim import SimFleet, SimRun
    from sdcguard.fleet.policy import QuarantinePolicy

    fleet = SimFleet(devices=64, defective_share=0.0, transient_rate=0.0, shared_defect_devices=6, seed=1)
    run = SimRun(tmp_path, fleet, QuarantinePolicy())  # the default 60 s budget
    days = [run.day(d) for d in range(2)]
    batch = {f"sim:{n}" for n in fleet.shared_batch()}
    assert set(run.quarantined_on) == batch and not any(d.breaker_tripped for d in days)


_text = st.text(max_size=12)
_opt_text = st.none() | _text


@st.composite
def _summaries(draw: st.DrawFn) -> DeviceSummary:
    device = draw(_text)
    kind = draw(st.sampled_from(["cpu", "gpu"]))
    variant = draw(st.sampled_from(["scanned", "locked", "busy", "error"]))
    if variant == "locked":
        return DeviceSummary(device=device, kind=kind, status="locked", reason=draw(_text))
    if variant == "busy":
        return DeviceSummary(device=device, kind=kind, status="busy", reason=draw(_text), idle_error=draw(_opt_text))
    if variant == "error":  # before a scan began: the worker may not know the kind
        return DeviceSummary(
            device=device,
            kind=draw(st.none() | st.just(kind)),
            status="error",
            error=draw(_text),
            error_type=draw(_opt_text),
        )
    counts = st.integers(0, 10**6)
    return DeviceSummary(
        device=device,
        kind=kind,
        status=draw(st.sampled_from(["complete", "preempted", "interrupted", "error"])),
        scan=draw(st.integers(1, 10**6)),
        executions=draw(counts),
        failures=draw(counts),
        retest_runs=draw(counts),
        failing_cases=draw(st.dictionaries(_text, counts, max_size=3)),
        sticky_cases=tuple(draw(st.lists(_text, max_size=3))),
        elapsed_s=draw(st.floats(0, 1e4)),
        budget_s=draw(st.none() | st.floats(0.1, 1e4)),
        reason=draw(_opt_text),
        idle_error=draw(_opt_text),
        error=draw(_opt_text),
        telemetry_after=draw(st.none() | st.just({"temperature_c": 41})),
    )


@given(_summaries())
def test_a_device_summary_crosses_the_process_boundary_unchanged(summary: DeviceSummary) -> None:
    """What a worker writes (one JSON line) is what the runner reads back, and a skipped or failed device's event
    carries only what it says (no scan counts for a device that was never scanned)."""
    line = json.dumps(summary.to_json())
    event = json.loads(line)
    assert event["event"] == "done" and DeviceSummary.from_json(event) == summary
    assert ("scan" in event) == summary.scanned == ("executions" in event)
