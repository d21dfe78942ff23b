"""The fleet scanner end to end on this machine's CPU cores: real worker processes, the real store and policy."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleet_scan.devices.idle import DeviceLock
from sdcguard.cli import cli
from sdcguard.devices import cpu_id, hostname
from sdcguard.fleet.actions import ActionTemplate
from tests._scan import (
    ROOT,
    argv_recorder,
    cores,
    env,
    events,
    report,
    resigned_golden,
    scan,
    sdcguard,
    store_rows,
    tampered_golden,
)

pytestmark = pytest.mark.slow


def test_scan_of_this_machine_passes_within_budget_and_report_shows_healthy(tmp_path: Path) -> None:
    db, budget = tmp_path / "fleet.db", 3.0
    proc = scan(db, tmp_path / "locks", budget=budget)
    assert proc.returncode == 0, proc.stderr
    done = {e["device"]: e for e in events(proc) if e["event"] == "done"}
    assert set(done) == {cpu_id(c) for c in cores()}
    assert all(e["status"] == "complete" and e["executions"] > 0 and e["failures"] == 0 for e in done.values())
    assert events(proc)[-1]["event"] == "summary" and events(proc)[-1]["exit_code"] == 0
    rows = report(db)
    for core in cores():
        row = rows[cpu_id(core)]
        assert row["status"] == "healthy" and row["failures"] == 0
        assert row["executions"] == done[cpu_id(core)]["executions"]
    # the budget is honoured within 5% (the scan's own start-to-final-record time), and mostly used
    for started, finished, meta in store_rows(db, "SELECT started_at, finished_at, meta FROM scans"):
        assert 0.7 * budget <= finished - started <= 1.05 * budget
        meta = json.loads(meta)
        assert meta["telemetry_before"]["time"] <= meta["telemetry_after"]["time"]


def test_inject_quarantines_that_core_only_and_runs_the_action(tmp_path: Path) -> None:
    db, locks = tmp_path / "fleet.db", tmp_path / "locks"
    drills = tmp_path / "fleet.drills.db"  # where a drill's results go, never --db
    bad = cores()[-1]
    template, log = argv_recorder(tmp_path)
    for _ in range(2):  # repeated scans: quarantined once, the action runs once
        proc = scan(db, locks, "--inject", f"cpu:{bad}:bitflip,rate=1.0", "--action", template)
        assert proc.returncode == 1, proc.stderr
        assert "corruption found" in proc.stderr
        # progress: one failure event per failing case, with its count and first failing element. How many times
        # a case ran within the budget depends on the machine's speed and load; each count must equal the failed
        # executions of that case the store kept for this scan, whatever they are.
        failures = [e for e in events(proc) if e["event"] == "failure"]
        (done,) = [e for e in events(proc) if e["event"] == "done" and e["device"] == cpu_id(bad)]
        assert sorted(e["case"] for e in failures) == sorted(done["failing_cases"])
        assert sum(e["count"] for e in failures) == done["failures"] >= len(failures) > 0
        assert all(e["element"] is not None and e["xor_mask"] and e["device"] == cpu_id(bad) for e in failures)
        kept = store_rows(
            drills,
            "SELECT r.case_id, COUNT(*) FROM results r JOIN scans s ON s.id = r.scan WHERE r.passed = 0 AND "
            "r.attempt = 0 AND r.device = ? AND s.id = (SELECT MAX(id) FROM scans WHERE device = ?) GROUP BY r.case_id",
            (cpu_id(bad), cpu_id(bad)),
        )
        assert {e["case"]: e["count"] for e in failures} == dict(kept)
    assert not db.exists(), "a drill never enters the fleet's record"
    rows = report(drills)
    assert rows[cpu_id(bad)]["status"] == "quarantined"
    assert {d for d, r in rows.items() if r["status"] != "healthy"} == {cpu_id(bad)}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1
    device, host, reason = calls[0]
    assert device == cpu_id(bad) and host == hostname() and "sticky" in reason
    # the failure is localized and was reproduced on retest in a fresh process
    failed = store_rows(
        drills,
        "SELECT location, xor_mask, element, sticky, attempt FROM results WHERE passed = 0 AND device = ? ORDER BY id",
        (cpu_id(bad),),
    )
    assert failed and all(loc == f"core:{bad}" and xor and el is not None for loc, xor, el, _, _ in failed)
    assert any(sticky == 1 for *_, sticky, attempt in failed if attempt == 0)
    assert any(attempt > 0 for *_, attempt in failed)


def test_an_intermittent_fire_drill_keeps_every_failure_and_its_rate(tmp_path: Path) -> None:
    """Passing executions fold into a row per case; each failed one keeps its own row; the rate is estimated
    right (bounds at 99.9% contain the injected 5%: a miss here is a one-in-500 event, not noise)."""
    db, drills = tmp_path / "fleet.db", tmp_path / "fleet.drills.db"
    core = cores()[0]
    proc = scan(
        db,
        tmp_path / "locks",
        "--device",
        f"cpu:{core}",
        "--inject",
        f"cpu:{core}:bitflip,rate=0.05,timing=intermittent",
        budget=3.0,
    )
    assert proc.returncode == 1, proc.stderr
    (done,) = [e for e in events(proc) if e["event"] == "done"]
    ((failed_rows,),) = store_rows(drills, "SELECT COUNT(*) FROM results WHERE passed = 0 AND attempt = 0")
    ((passing_rows, passing),) = store_rows(
        drills, "SELECT COUNT(*), SUM(executions) FROM results WHERE passed = 1 AND attempt = 0"
    )
    assert failed_rows == done["failures"] > 0 and passing == done["executions"] - done["failures"], (
        failed_rows,
        passing,
        done,
    )
    assert passing_rows <= 31  # one per case
    r = sdcguard(db, "report", "--drills", "--format", "json", "--confidence", "0.999")
    (row,) = json.loads(r.stdout)
    assert row["rate_low"] <= 0.05 <= row["rate_high"], row


def test_tampered_golden_file_exits_2_and_quarantines_nobody(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    golden = tampered_golden(tmp_path)
    template, log = argv_recorder(tmp_path)
    proc = scan(db, tmp_path / "locks", "--golden-dir", str(golden), "--action", template)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "sha256" in line.lower() and ".bin" in line, line
    # checked before anything is touched: no scan recorded, nobody quarantined, no action run
    assert not db.exists() or store_rows(db, "SELECT COUNT(*) FROM scans") == [(0,)]
    assert not log.exists()


@pytest.mark.skipif(len(cores()) < 2, reason="needs two CPU cores to fail identically")
def test_golden_rows_edited_and_re_signed_are_refused_by_scan_as_by_verify(tmp_path: Path) -> None:
    golden = resigned_golden(tmp_path)
    verify = sdcguard(tmp_path / "v.db", "golden", "verify", "--dir", str(golden))
    assert verify.returncode == 2 and "stored rows of memory.u32.moving_inversions" in verify.stderr
    db = tmp_path / "fleet.db"
    proc = scan(db, tmp_path / "locks", "--golden-dir", str(golden))
    assert proc.returncode == 2, proc.stderr
    assert "stored rows of memory.u32.moving_inversions differ from the reference" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not db.exists() or store_rows(db, "SELECT COUNT(*) FROM scans") == [(0,)]


def test_identical_failures_on_two_devices_trip_the_breaker(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    template, log = argv_recorder(tmp_path)
    a, b = cores()[:2]
    # every element of one case zeroed: both cores produce the same wrong output, as a bad golden file would
    rule = "zero,rate=1.0,elements=100000000,case=alu.u32.*"
    spec = f"cpu:{a}:{rule};cpu:{b}:{rule}"
    proc = scan(
        db, tmp_path / "locks", "--device", f"cpu:{a}", "--device", f"cpu:{b}", "--inject", spec, "--action", template
    )
    assert proc.returncode == 2, proc.stderr
    assert "circuit breaker" in proc.stderr and "nobody quarantined" in proc.stderr
    assert store_rows(tmp_path / "fleet.drills.db", "SELECT COUNT(*) FROM quarantine") == [(0,)]
    assert not log.exists()
    policy = [e for e in events(proc) if e["event"] == "policy"][0]
    assert policy["breaker_tripped"] and not policy["quarantined"]


@pytest.mark.skipif(len(cores()) < 2, reason="needs a second core to pass what the faulty one fails")
def test_node_scope_quarantines_what_another_core_of_the_node_passed(tmp_path: Path) -> None:
    db, locks = tmp_path / "fleet.db", tmp_path / "locks"
    bad = cores()[-1]
    # Room for the failing case's retest (it runs only while it fits the budget) and for the other core to pass the
    # same case: with 1.5 s, a loaded machine once left no sticky failure and nobody quarantined.
    proc = scan(db, locks, "--policy-scope", "node", "--inject", f"cpu:{bad}:bitflip,rate=1.0", budget=4.0)
    assert proc.returncode == 1, proc.stderr
    policy = [e for e in events(proc) if e["event"] == "policy"][0]
    done = [e for e in events(proc) if e["event"] == "done"]
    assert policy["scope"] == "node" and policy["quarantined"] == [cpu_id(bad)], (policy, done)
    assert "on the same node passed it" in policy["reasons"][0]
    # every core fails one case identically: the node cannot tell a bad golden file from a bad batch, and waits
    rule = "zero,rate=1.0,elements=100000000,case=alu.u32.*"
    proc = scan(tmp_path / "other.db", locks, "--policy-scope", "node", "--inject", f"all:{rule}")
    assert proc.returncode == 1, proc.stderr
    policy = [e for e in events(proc) if e["event"] == "policy"][0]
    assert policy["quarantined"] == [] and not policy["breaker_tripped"]


def test_a_locked_device_is_left_alone(tmp_path: Path) -> None:
    db, locks = tmp_path / "fleet.db", tmp_path / "locks"
    core = cores()[0]
    with DeviceLock(cpu_id(core), locks):  # another scanner holds it
        proc = scan(db, locks, "--device", f"cpu:{core}", budget=1.0)
    assert proc.returncode == 0, proc.stderr
    done = [e for e in events(proc) if e["event"] == "done"]
    assert done[0]["status"] == "locked" and "another scanner" in done[0]["reason"]
    assert store_rows(db, "SELECT COUNT(*) FROM scans") == [(0,)]


def test_a_scan_that_found_every_device_busy_says_so_and_how_to_force_it(tmp_path: Path) -> None:
    db, locks = tmp_path / "fleet.db", tmp_path / "locks"
    core = cores()[0]
    spin = subprocess.Popen(  # another job keeps the core fully busy
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    try:
        time.sleep(0.5)
        proc = sdcguard(
            db,
            "scan",
            "--json",
            "--budget",
            "1",
            "--device",
            f"cpu:{core}",
            "--cpu-busy-max",
            "20",
            "--lock-dir",
            str(locks),
        )
    finally:
        spin.kill()
        spin.wait()
    # not exit 0 with an empty report: nothing was checked, and the line says how to scan anyway
    assert proc.returncode == 2, proc.stderr
    assert "no device scanned" in proc.stderr and "--all" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_a_scan_that_executed_nothing_is_not_a_pass(tmp_path: Path) -> None:
    """`--budget 0.001` runs no case: exit 2 "nothing was tested", never "all passed", and the scan it recorded
    is no complete scan in the report (scans 0, no last_scan)."""
    db = tmp_path / "fleet.db"
    proc = scan(db, tmp_path / "locks", "--device", f"cpu:{cores()[0]}", budget=0.001)
    assert proc.returncode == 2, proc.stderr
    assert "nothing was tested" in proc.stderr and "--budget" in proc.stderr and "passed" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    (summary,) = [e for e in events(proc) if e["event"] == "summary"]
    assert summary["exit_code"] == 2
    (row,) = report(db).values()
    assert row["executions"] == 0 and row["scans"] == 0 and row["last_scan"] is None


def _check_consistent(db: Path) -> None:
    if not db.exists():
        return  # killed before the store was created
    assert store_rows(db, "PRAGMA integrity_check") == [("ok",)]
    if not store_rows(db, "SELECT 1 FROM sqlite_master WHERE name = 'scans'"):
        return  # killed before the schema's (single) transaction committed: an empty store
    for scan_id, status, executions, total in store_rows(db, "SELECT id, status, executions, total FROM scans"):
        rows = store_rows(db, "SELECT seq, executions, attempt FROM results WHERE scan = ? ORDER BY seq", (scan_id,))
        assert [r[0] for r in rows] == list(range(len(rows))), "results are numbered without gaps"
        assert executions == sum(n for _, n, attempt in rows if attempt == 0)
        if status == "complete":
            assert rows, f"complete scan {scan_id} without results"
            assert total == sum(n for _, n, _ in rows), f"complete scan {scan_id} misses results"


def test_sigkill_at_any_moment_leaves_the_store_consistent(tmp_path: Path) -> None:
    db, locks = tmp_path / "fleet.db", tmp_path / "locks"
    rng = random.Random(7)
    bad = cores()[-1]

    def start(i: int) -> subprocess.Popen[bytes]:
        args = ["scan", "--all", "--json", "--budget", "0.6", "--lock-dir", str(locks)]
        if i % 2:  # failures and retests in flight too
            args += ["--inject", f"cpu:{bad}:bitflip,rate=0.5"]
        return subprocess.Popen(
            [sys.executable, "-m", "sdcguard", "--db", str(db), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env(),
            start_new_session=True,
        )

    # One whole scan first: its length (startup, workers, retests, policy) spans the moments to kill at.
    t0 = time.monotonic()
    start(1).wait()
    whole = time.monotonic() - t0
    _check_consistent(db)
    killed: set[int] = set()

    def kill(proc: subprocess.Popen[bytes]) -> None:
        killed.add(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the scanner, its workers and any retest process
        except ProcessLookupError:
            pass
        proc.wait()
        _check_consistent(db)

    def open_scans() -> int:
        return int(store_rows(db, "SELECT COUNT(*) FROM scans WHERE status IN ('running', 'interrupted')")[0][0])

    for i in range(20):
        proc = start(i)
        time.sleep(rng.uniform(0.05, whole))
        kill(proc)
    # On a loaded machine the first scan's length can be mostly start-up, so the random moments may all miss the
    # scans themselves: then kill more scans while their rows are being written (a scan row `running`).
    for i in range(10):
        if open_scans():
            break
        proc, before = start(i), store_rows(db, "SELECT COUNT(*) FROM scans")[0][0]
        deadline = time.monotonic() + 4 * whole
        while proc.poll() is None and time.monotonic() < deadline:
            if store_rows(db, "SELECT COUNT(*) FROM scans")[0][0] > before:
                time.sleep(rng.uniform(0.0, 0.3))
                break
            time.sleep(0.02)
        kill(proc)
    # a scan killed mid-way stays `running` until the device's next scan (or the policy) marks it interrupted
    assert open_scans(), "no kill landed during a scan: the test did not test anything"
    # the next scan of a device marks what a killed scanner left `running` as interrupted
    final = scan(db, locks, budget=0.5)
    assert final.returncode in (0, 1), final.stderr
    _check_consistent(db)
    assert store_rows(db, "SELECT COUNT(*) FROM scans WHERE status = 'running'") == [(0,)]
    # and the references a killed scanner left in /dev/shm are gone (kept only by scanners still running)
    import tempfile

    for left in [
        *Path("/dev/shm").glob("sdcguard-references-*"),
        *Path(tempfile.gettempdir()).glob("sdcguard-references-*"),
    ]:
        pid = int(left.name.split("-")[2])
        assert pid not in killed, f"{left} of killed scanner {pid} was not removed"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_records_what_was_done_as_interrupted_and_exits_non_zero(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    db = tmp_path / "fleet.db"
    core = cores()[0]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sdcguard",
            "--db",
            str(db),
            "scan",
            "--all",
            "--json",
            "--budget",
            "30",
            "--device",
            f"cpu:{core}",
            "--lock-dir",
            str(tmp_path / "locks"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the device's scan has begun, and a little more
        if '"progress"' in line:
            break
    proc.send_signal(sig)  # the scanner passes it on to its workers (as Slurm, Kubernetes or a Ctrl-C would)
    out, err = proc.communicate(timeout=60)
    # Not 0 ("all passed"): the device was not fully checked. 128 + the signal, as a shell reports it.
    assert proc.returncode == code, err
    assert f"stopped by {sig.name}" in err and "interrupted" in err and err.strip().count("\n") == 0, err
    ((status, executions),) = store_rows(db, "SELECT status, executions FROM scans")
    assert status == "interrupted" and executions > 0
    summary = [json.loads(x) for x in out.splitlines() if '"summary"' in x][-1]
    assert summary["stopped_by"] == sig.name and summary["exit_code"] == code
    done = [json.loads(x) for x in out.splitlines() if '"done"' in x][-1]
    assert done["reason"] == f"stopped by {sig.name}"
    _check_consistent(db)


def test_python_m_fleet_scan_is_sdcguard_scan(tmp_path: Path) -> None:
    a = sdcguard(tmp_path / "x.db", "scan", "--help")
    b = sdcguard(tmp_path / "x.db", "--help", module="fleet_scan")
    assert a.returncode == b.returncode == 0
    assert a.stdout.replace("sdcguard scan", "X") == b.stdout.replace("python -m fleet_scan", "X")
    assert "--inject SPEC" in a.stdout and "bitflip" in a.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--budget", "0"], "--budget"),
        (["--device", "banana"], "bad device spec"),
        (["--device", "cpu:999"], "no CPU core cpu:999"),
        (["--inject", "cpu:0:frobnicate"], "frobnicate"),
        (["--action", "scontrol {nodename}"], "placeholder"),
        (["--retests", "-1"], "--retests"),
        # a fire drill that would inject nothing: refused before any scanning, not a silent "all passed"
        (["--inject", "cpu:4095:zero"], "names no device this scan scans"),
        (["--device", "cpu:0", "--inject", "cpu:1:zero"], "names no device this scan scans"),
        (["--inject", "all:zero,case=nomatch*"], "matches no golden case"),
        (["--inject", "all:zero,case=intrinsics.*"], "matches no golden case"),  # GPU-only cases, on CPU cores
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    result = CliRunner().invoke(
        cli, ["--db", str(tmp_path / "x.db"), "scan", "--all", "--lock-dir", str(tmp_path / "locks"), *args]
    )
    assert result.exit_code == 2, result.output
    assert words in result.output and result.output.strip().count("\n") == 0, result.output
    assert not (tmp_path / "x.db").exists() or store_rows(tmp_path / "x.db", "SELECT COUNT(*) FROM scans") == [(0,)]


def test_actions_are_argument_lists_never_a_shell() -> None:
    t = ActionTemplate.from_text("scontrol update NodeName={host} State=DRAIN 'Reason=sdc {reason}'")
    assert t.argv == ("scontrol", "update", "NodeName={host}", "State=DRAIN", "Reason=sdc {reason}")
    argv = t.render(device="cpu:h:1", host="h", reason="x; rm -rf /")
    assert argv[-1] == "Reason=sdc x; rm -rf /"
    assert ActionTemplate.from_text("slurm-drain").name == "slurm-drain"
    echo = ActionTemplate.from_text("echo {device}")
    assert echo.name == ActionTemplate.from_text("echo {device}").name  # stable across runs


def test_no_torch_in_the_scanner() -> None:
    code = (
        "import sys; import fleet_scan.device_scan.worker, fleet_scan.runner, fleet_scan.command; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
