"""The prepared GPU check (scripts/gpu_check.sh and scripts/gpu_check/): its dry run goes through every section and
prints its summary; bad arguments are one line; a section that dies or outlives its limit is a failure; and the
Python of every section runs against the CPU and stand-in paths (host-built kernels behind a fake cupy, CPU
tensors, a CPU core for the scanner, a stand-in NVML)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check import SECTIONS, SectionReport  # noqa: E402
from gpu_check.context import Context, cuda_unavailable_reason  # noqa: E402
from gpu_check.sections import TOTAL_LIMIT_S, select  # noqa: E402

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["PYTHON"] = sys.executable
    return env


def _gpu_check(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=_env(), timeout=timeout)


def _module(*args: str) -> subprocess.CompletedProcess[str]:
    env = _env()
    env["PYTHONPATH"] = f"{ROOT}:{ROOT / 'scripts'}"
    return subprocess.run(
        [sys.executable, "-m", "gpu_check", *args], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )


# ------------------------------------------------------------------------------------------- the script itself


def test_the_dry_run_goes_through_every_section_and_prints_its_summary(tmp_path: Path) -> None:
    done = _gpu_check("--dry-run", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    verdicts = re.findall(r"^\[([a-z0-9-]+)\] (PASS|FAIL|SKIP) \([\d.]+ s\): (.*)$", out, re.M)
    assert [v[0] for v in verdicts] == [s.name for s in SECTIONS]
    for s in SECTIONS:
        assert f"== {s.name}: {s.title} (limit {s.timeout_s} s)" in out
    status = {name: (st, why) for name, st, why in verdicts}
    assert status["golden-data"][0] == "PASS"  # needs no GPU: verified for real
    for name, (st, why) in status.items():
        if name != "golden-data":
            assert st == "SKIP" and why.startswith("dry run: would "), (name, st, why)
    skipped = len(SECTIONS) - 1
    assert re.search(rf"^gpu_check: 1 PASS, 0 FAIL, {skipped} SKIP in [\d.]+ s \(dry run\)$", out, re.M)
    body = json.loads((tmp_path / "results.json").read_text())
    assert body["format"] == "sdcguard-gpu-check/1" and body["run"]["dry_run"] is True
    assert [(s["section"], s["status"]) for s in body["sections"]] == [(n, status[n][0]) for n, *_ in verdicts]
    assert body["summary"]["PASS"] == 1 and body["summary"]["SKIP"] == skipped
    assert f"gpu_check: 1 PASS, 0 FAIL, {skipped} SKIP" in (tmp_path / "gpu_check.log").read_text()
    assert "dry run: would check every matmul of" in status["checksums"][1]  # the checksum section is walked
    assert "dry run: would train compile(ddp) and blocks fsdp2 with inductor" in status["compiled"][1]
    assert "dry run: would train a GPT-2 with the Trainer and Accelerate's FSDP2 plugin" in status["hf-fsdp2"][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.log", "results.json"]


def test_only_runs_the_named_sections(tmp_path: Path) -> None:
    done = _gpu_check("--dry-run", "--only", "drill,golden-data", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.findall(r"^\[([a-z0-9-]+)\]", done.stdout, re.M) == ["golden-data", "drill"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "unknown argument --bogus"),
        (["--only", "nosuch"], "no section 'nosuch'"),
        (["--out"], "--out needs a folder"),
        (["--promote"], "--promote needs candidate files"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = _gpu_check(*args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_help_is_the_script_header() -> None:
    done = _gpu_check("--help")
    assert done.returncode == 0 and "--dry-run" in done.stdout and "Exit status" in done.stdout
    assert "set -uo" not in done.stdout


def test_sections_fit_in_eight_minutes_and_each_names_its_work() -> None:
    assert TOTAL_LIMIT_S <= 480
    assert len({s.name for s in SECTIONS}) == len(SECTIONS)
    for s in SECTIONS:
        assert callable(s.runner())
    assert [s.name for s in select("scan, golden-data")] == ["golden-data", "scan"]


def test_every_command_line_of_the_docs_runs_as_a_dry_run(tmp_path: Path) -> None:
    """The page names no flag the script refuses: each of its command lines runs with --dry-run (a --promote with
    two candidates that are not there is refused for the files, never for its arguments)."""
    import shlex

    text = (ROOT / "docs" / "gpu-check.md").read_text()
    lines = {m.strip() for m in re.findall(r"scripts/gpu_check\.sh((?: +[^\s`#;]+)*)", text)}
    flags = {f for line in lines for f in re.findall(r"--[a-z-]+", line)}
    assert {"--dry-run", "--out", "--only", "--promote"} <= flags, flags
    for line in sorted(lines):
        args = [tmp_path / "out" if a == "/tmp/gc" else a for a in shlex.split(line)]
        argv = [str(a) for a in args]
        if "--promote" in argv:
            done = _gpu_check(*argv)
            assert done.returncode != 0 and "unknown argument" not in done.stderr, done.stderr
            continue
        if "--only" not in argv:
            argv += ["--only", "golden-data"]  # the whole dry run is the test above
        done = _gpu_check(*argv, "--dry-run", "--out", str(tmp_path / "out"))
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr)


def test_the_docs_list_every_section_with_its_limit() -> None:
    text = (ROOT / "docs" / "gpu-check.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\d+) s \|", text, re.M)
    assert rows == [(s.name, str(s.timeout_s)) for s in SECTIONS]


def test_pytest_summary_counts() -> None:
    from gpu_check.gpu_tests import counts

    assert counts("12 passed, 1 skipped, 25 deselected in 3.20s") == {"passed": 12, "skipped": 1, "deselected": 25}
    assert counts("1 failed, 20 passed, 2 errors in 9s") == {"failed": 1, "passed": 20, "errors": 2}


def test_a_section_that_dies_or_outlives_its_limit_is_a_failure(tmp_path: Path) -> None:
    assert _module("begin", "--out", str(tmp_path)).returncode == 0
    timed = _module("finish", "training", "--out", str(tmp_path), "--rc", "124", "--timeout", "7")
    assert timed.stdout.startswith("[training] FAIL") and "timed out after 7 s" in timed.stdout
    died = _module("finish", "scan", "--out", str(tmp_path), "--rc", "1", "--timeout", "7")
    assert "[scan] FAIL" in died.stdout and "exited with status 1 before recording" in died.stdout
    late = _module("finish", "drill", "--out", str(tmp_path), "--rc", "0", "--skip-reason", "no time left")
    assert "[drill] SKIP (0.0 s): no time left" in late.stdout
    summary = _module("summary", "--out", str(tmp_path))
    assert summary.returncode == 1 and "gpu_check: 0 PASS, 2 FAIL, 1 SKIP" in summary.stdout


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="this machine has CUDA: the section would run")
def test_without_cuda_a_gpu_section_skips_and_says_why(tmp_path: Path) -> None:
    assert _module("begin", "--out", str(tmp_path)).returncode == 0
    assert _module("run", "intrinsics", "--out", str(tmp_path), "--timeout", "60").returncode == 0
    (entry,) = json.loads((tmp_path / "results.json").read_text())["sections"]
    assert entry["status"] == "SKIP" and entry["reason"].startswith("no CUDA here (")


def test_every_cuda_source_the_check_runs_builds_machine_code_for_an_h200() -> None:
    """NVRTC with an sm_90 target runs ptxas too: what the driver would refuse at load time fails here."""
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    from sdcguard.kernels import kernel_source, kernel_sources
    from sdcguard.resources import kernels_dir

    nvrtc = cupy.cuda.nvrtc
    sources = {name: kernel_source(name) for name in kernel_sources()}
    assert len(sources) == 7 and "fingerprint/chunk_sums.cu" in sources
    for name, src in sources.items():
        try:
            prog = nvrtc.createProgram(src, name, [], [])
        except Exception as e:  # the NVRTC library itself is missing
            pytest.skip(f"NVRTC unavailable: {e}")
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=sm_90", "-std=c++17", f"-I{kernels_dir()}"])
            assert len(nvrtc.getCUBIN(prog)) > 1000, name
        except nvrtc.NVRTCError as e:
            pytest.fail(f"{name} does not build for sm_90: {e}\n{nvrtc.getProgramLog(prog)}")
        finally:
            nvrtc.destroyProgram(prog)


def test_outcome_rules() -> None:
    rep = SectionReport("x", stream=open(os.devnull, "w"))
    assert rep.outcome(seconds=0, timeout_s=1).status == "FAIL"  # no check made: nothing proven
    rep.check("a", True)
    assert rep.outcome(seconds=0, timeout_s=1, skip="dry run").status == "SKIP"
    assert rep.outcome(seconds=0, timeout_s=1, passed="fine").reason == "fine"
    rep.check("b", False, "it broke")
    o = rep.outcome(seconds=0, timeout_s=1, skip="dry run")
    assert (o.status, o.reason) == ("FAIL", "b (it broke)")
    assert rep.outcome(seconds=0, timeout_s=1, error="ValueError: x").reason == "ValueError: x"


# ------------------------------------------------------------------------------ sections on CPU and stand-ins


@pytest.fixture(scope="module")
def host_build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from sdcguard.golden.hostbuild import HostBuild

    return HostBuild(tmp_path_factory.mktemp("hostbuild"))


@pytest.fixture()
def fake_cupy(host_build: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tests._fake_cupy import install

    install(monkeypatch, host_build)
    cuda_unavailable_reason.cache_clear()
    yield sys.modules["cupy"]
    cuda_unavailable_reason.cache_clear()


FAMILY_SAMPLE = (
    "gemm.fp32.int.cublas",
    "gemm.bf16.perm.mma",
    "alu.u32.chain",
    "ieee.fp32.div",
    "memory.u32.moving_inversions",
    "shared.u32.reduce",
)


@pytest.mark.slow
def test_golden_suite_measures_every_family_on_the_host_build(fake_cupy: Any, tmp_path: Path) -> None:
    from gpu_check.golden_suite import measure_gpu, table_lines

    rep = SectionReport("golden-suite", stream=open(os.devnull, "w"))
    info = measure_gpu(fake_cupy, 0, rep, runs=2, repeats=1, memory_share=0.25, peak_n=64, case_ids=FAMILY_SAMPLE)
    assert not rep.failed and len(rep.checks) == len(FAMILY_SAMPLE)
    assert set(info["cases"]) == set(FAMILY_SAMPLE) and all(c["passed"] for c in info["cases"].values())
    assert info["gemm"]["fp32"]["reference"] == "cupy.matmul fp32" and info["gemm"]["fp32"]["peak_n"] == 64
    assert info["gemm"]["bf16"]["reference"] == "cupy.matmul fp16"
    assert info["memory"]["gib_marched"] == pytest.approx(16 / 1024)  # a quarter of the fake's 64 MiB free
    assert info["memory"]["suite_gbps"] > 0 and info["alu"]["gelem_s"] > 0
    assert [line.split()[0] for line in table_lines(info)] == [
        "family",
        "gemm.fp32",
        "gemm.bf16",
        "memory",
        "alu",
        "ieee",
        "shared",
    ]
    # benchmarks/suite_gpu.py prints the same table from a recorded run
    from gpu_check.results import Outcome, begin, record

    begin(tmp_path, {})
    record(tmp_path, Outcome(section="golden-suite", status="PASS", reason="", measurements={"gpus": {"cuda:0": info}}))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "suite_gpu.py"), "--from", str(tmp_path / "results.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "6 cases, all passed" in done.stdout and "gemm.bf16" in done.stdout, done.stderr


@pytest.mark.slow
def test_golden_suite_names_a_failing_case(fake_cupy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_check.golden_suite import measure_gpu
    from sdcguard.golden import CupyBackend
    from tests._golden import bit_flip_hook

    real = CupyBackend.run
    monkeypatch.setattr(
        CupyBackend,
        "run",
        lambda self, case, output_hook=None: real(self, case, output_hook=bit_flip_hook("alu.u32.chain", 17, 3)),
    )
    rep = SectionReport("golden-suite", stream=open(os.devnull, "w"))
    measure_gpu(fake_cupy, 0, rep, runs=1, repeats=1, peak_n=64, case_ids=("alu.u32.chain", "ieee.fp32.div"))
    (bad,) = rep.failed
    assert bad.name == "cuda:0 alu.u32.chain" and "element 17" in bad.detail and "at sm:" in bad.detail


@pytest.mark.slow
def test_golden_suite_past_its_deadline_says_how_far_it_got(fake_cupy: Any) -> None:
    from gpu_check.golden_suite import measure_gpu

    rep = SectionReport("golden-suite", stream=open(os.devnull, "w"))
    info = measure_gpu(fake_cupy, 0, rep, runs=1, repeats=1, peak_n=64, case_ids=("alu.u32.chain",), deadline=0.0)
    (bad,) = rep.failed
    assert "0 of 1 ran" in bad.detail and info["cases"] == {}


@pytest.mark.slow
def test_intrinsics_section_writes_a_candidate_and_two_devices_promote_it(fake_cupy: Any, tmp_path: Path) -> None:
    from gpu_check import intrinsics
    from sdcguard.golden.candidates import read_candidates, write_candidates
    from tests._golden import copy_golden

    rep = SectionReport("intrinsics", stream=open(os.devnull, "w"))
    said = intrinsics.run(Context(out=tmp_path), rep)
    assert not rep.failed and "a golden needs a second device" in said
    (cand,) = read_candidates(tmp_path / "intrinsics-sm_90.json")
    assert cand.device == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f" and cand.arch == "sm_90"
    assert rep.measurements["candidates"]["sm_90"]["promotable"] is False
    other = write_candidates(
        tmp_path / "other.json", [type(cand)(case=cand.case, arch="sm_90", device="GPU-b", output=cand.output.copy())]
    )
    golden = copy_golden(tmp_path / "golden")
    alone = _module("promote", str(tmp_path / "intrinsics-sm_90.json"), "--golden-dir", str(golden))
    assert alone.returncode == 2 and "needs 2 different devices" in alone.stderr and alone.stderr.count("\n") == 1
    both = _module("promote", str(tmp_path / "intrinsics-sm_90.json"), str(other), "--golden-dir", str(golden))
    assert both.returncode == 0 and "intrinsics/sm_90/intrinsics.fp32.fast.bin" in both.stdout


def test_intrinsics_accuracy_bound_catches_a_garbled_row() -> None:
    from gpu_check.intrinsics import TOLERANCE, accuracy
    from sdcguard.golden import case_by_id
    from sdcguard.golden.inputs import make_inputs

    inp = make_inputs(case_by_id("intrinsics.fp32.fast"))
    x, y = inp["x"].astype(np.float64), inp["y"].astype(np.float64)
    exact = np.stack([np.exp(x), np.log(y), np.sin(x), np.cos(x), x / y]).astype(np.float32)
    assert max(accuracy(exact, inp).values()) <= TOLERANCE
    swapped = exact[[0, 1, 3, 2, 4]]  # sin and cos rows swapped: a layout bug
    errors = accuracy(swapped, inp)
    assert errors["__sinf"] > TOLERANCE and errors["__cosf"] > TOLERANCE and errors["__expf"] <= TOLERANCE


def test_fingerprint_sweep_agrees_on_cpu_and_names_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from gpu_check import fingerprint_check as fc

    cases = fc.sweep(torch, large=3000)
    names = {c.name for c in cases}
    assert {"bfloat16[5, 7].transposed", "complex64[3].conj", "uint8[3].offset1", "float32[5, 7].expanded"} <= names
    rep = SectionReport("fingerprint", stream=open(os.devnull, "w"))
    m = fc.check_sweep(rep, torch.device("cpu"), cases, with_cupy=False)
    fc.check_flips(rep, torch.device("cpu"))
    assert not rep.failed and m["cases"] == len(cases) and not m["misses"]
    bw = fc.bandwidth(torch.device("cpu"), 1 << 20, repeats=1)
    assert bw["copy_gbps"] > 0 and bw["fused_share"] > 0
    real = fc.reference
    monkeypatch.setattr(fc, "reference", lambda v: real(v) ^ (1 if v.dtype == torch.int16 else 0))
    rep = SectionReport("fingerprint", stream=open(os.devnull, "w"))
    fc.check_sweep(
        rep, torch.device("cpu"), [c for c in cases if c.name.startswith(("int16", "float32"))], with_cupy=False
    )
    assert len(rep.failed) == 3 and all("differ: int16[" in c.detail for c in rep.failed)


@pytest.mark.slow
@pytest.mark.distributed
def test_training_job_on_cpu_ranks_passes_every_check() -> None:
    from gpu_check import training

    ranks = training.run_job(device="cpu", timeout=150)
    rep = SectionReport("training", stream=open(os.devnull, "w"))
    training.evaluate(rep, ranks, device="cpu", device_prefix="cpu:")
    assert not rep.failed, rep.failed
    assert len(rep.checks) == 8 * len(training.PRECISIONS)
    assert rep.measurements["bf16"]["incident"]["suspect_ranks"] == [training.FAULTY_RANK]


@pytest.mark.slow
@pytest.mark.distributed
def test_compiled_jobs_on_cpu_ranks_pass_every_check() -> None:
    """The section's jobs on CPU tensors over gloo, compiled with aot_eager (inductor on a GPU)."""
    from gpu_check import compiled

    jobs = compiled.run_job(device="cpu", timeout=200, backend="aot_eager")
    rep = SectionReport("compiled", stream=open(os.devnull, "w"))
    compiled.evaluate(rep, jobs)
    assert not rep.failed, rep.failed
    assert len(rep.checks) == 6 * len(compiled.SETUPS)
    assert rep.measurements["compile(ddp)"]["incident"]["suspect_ranks"] == [compiled.FAULTY_RANK]
    assert rep.measurements["blocks fsdp2"]["incident"]["suspect_ranks"] == [0]


def test_compiled_checks_fail_when_the_guard_changes_the_weights_or_misses_the_fault() -> None:
    from gpu_check import compiled

    def rank(r: int, setup: str) -> dict[str, Any]:
        steps = [{"step": s, "commit": True, "incidents": [], "matmuls_run": 0} for s in range(compiled.STEPS)]
        run = {"steps": steps, "fingerprints": [1, 2], "injected": 1}
        drifted = {**run, "fingerprints": [1, 3] if setup == "blocks fsdp2" else [1, 2]}
        return {"plain": run, "clean": drifted, "faulty": run, "device": "cuda:0"}

    jobs = {setup: [rank(r, setup) for r in range(compiled.DDP_WORLD)] for setup in compiled.SETUPS}
    rep = SectionReport("compiled", stream=open(os.devnull, "w"))
    compiled.evaluate(rep, jobs)
    assert sorted(c.name for c in rep.failed) == sorted(
        [
            "blocks fsdp2: the guarded run's weights are the unguarded run's, bit for bit",
            *(f"{s}: no rank commits the faulty step" for s in compiled.SETUPS),
            f"compile(ddp): the incident names rank {compiled.FAULTY_RANK} alone",
            "blocks fsdp2: the incident names rank 0 alone",
        ]
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_hf_fsdp2_job_on_a_cpu_rank_passes_every_check(tmp_path: Path) -> None:
    """The section's Trainer job on the CPU: the model sharded by hand (the plugin falls back to DDP here)."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate (the Trainer needs it) is not installed")
    from gpu_check import hf_fsdp2

    found = hf_fsdp2.run_job(device="cpu", timeout=150, out_dir=str(tmp_path))
    rep = SectionReport("hf-fsdp2", stream=open(os.devnull, "w"))
    hf_fsdp2.evaluate(rep, found, plugin=False)
    assert not rep.failed, rep.failed
    assert len(rep.checks) == 6


def test_hf_fsdp2_checks_fail_without_the_plugin_or_with_the_fault_applied() -> None:
    from gpu_check import hf_fsdp2

    steps = [{"step": s, "commit": True, "changed": True, "incidents": []} for s in range(hf_fsdp2.STEPS)]
    found = {
        "steps": steps, "injected": 2, "samples": hf_fsdp2.STEPS, "taps": "FSDPTaps", "wrapped": "GPT2LMHeadModel",
        "plugin": False, "device": "cuda:0",
    }  # fmt: skip
    rep = SectionReport("hf-fsdp2", stream=open(os.devnull, "w"))
    hf_fsdp2.evaluate(rep, found, plugin=True)
    assert [c.name for c in rep.failed] == [
        "the Trainer sharded with Accelerate's FSDP2 plugin",
        "the faulty step is vetoed and changes no weight",
        "its incident names rank 0",
    ]


@pytest.mark.slow
def test_the_checksum_section_measures_every_precision_on_cpu_tensors() -> None:
    """The section's measurement and checks on CPU tensors (the same code a GPU runs, smaller): every precision's
    clean steps silent, the counts adding up, a fault of every bit class injected and the NaN one caught, and a
    checked step's cost measured beside an unchecked one."""
    import time

    from gpu_check import checksums

    found = [
        checksums.measure(device="cpu", precision=p, settings=checksums.SMALL, deadline=time.monotonic() + 60)
        for p in checksums.PRECISIONS
    ]
    rep = SectionReport("checksums", stream=open(os.devnull, "w"))
    checksums.evaluate(rep, found)
    assert not rep.failed, rep.failed
    assert len(rep.checks) == 4 * len(checksums.PRECISIONS)
    for f in found:
        run, checked, unverifiable = f["counts"]
        assert run > 0 and checked + unverifiable <= run and f["cost"] is not None
        assert all(n == 1 for n, _ in f["faults"].values()), f["faults"]
    assert rep.measurements["fp32"]["counts"][1] == rep.measurements["fp32"]["counts"][0]  # fp32 on a CPU: all


def test_the_checksum_checks_fail_on_a_false_alarm_or_a_missed_nan() -> None:
    from gpu_check import checksums

    good = {
        "precision": "bf16",
        "steps": 10,
        "false_alarms": 0,
        "counts": (21, 6, 15),
        "counts_add_up": True,
        "unverifiable": ["15 matmul(s) with bfloat16 results under ..."],
        "cost": 0.05,
        "faults": {c: [1, 1] for c in checksums.CLASSES},
    }
    rep = SectionReport("checksums", stream=open(os.devnull, "w"))
    checksums.evaluate(rep, [good])
    assert not rep.failed
    bad = {**good, "false_alarms": 1, "faults": {**good["faults"], "nan": [2, 1]}}
    rep = SectionReport("checksums", stream=open(os.devnull, "w"))
    checksums.evaluate(rep, [bad])
    assert [c.name for c in rep.failed] == [
        "bf16: 10 clean steps, no checksum alarm",
        "bf16: every NaN in a matmul output caught on its step",
    ]


def test_training_checks_fail_when_the_fault_goes_unnamed() -> None:
    from gpu_check import training

    def rank(r: int) -> dict[str, Any]:
        steps = [
            {
                "step": s,
                "commit": True,
                "incidents": [],
                "weight_incidents": [],
                "seconds": 0.1,
                "injected": 3 if (s == training.CLEAN_STEPS and r == training.FAULTY_RANK) else 0,
            }
            for s in range(training.STEPS)
        ]
        one = {
            "calibration": {"deterministic": True, "text": "ok"},
            "steps": steps,
            "incidents": 0,
            "param_device": "cuda:0",
        }
        return {p: one for p in training.PRECISIONS}

    rep = SectionReport("training", stream=open(os.devnull, "w"))
    training.evaluate(rep, [rank(r) for r in range(training.WORLD)], device="cuda:0", device_prefix="GPU-")
    assert {c.name.split(": ", 1)[1] for c in rep.failed} == {
        "no rank commits the faulty step",
        f"the incident names rank {training.FAULTY_RANK} alone and its device",
        "the gradient's path into DDP's all-reduce is checked on every step",
        f"a gradient changed after the guard's hook on rank {training.FAULTY_RANK} is vetoed and names it alone",
    }


@pytest.mark.slow
def test_scan_and_fire_drill_on_a_cpu_core(tmp_path: Path) -> None:
    from gpu_check import fleet

    rep = SectionReport("scan", stream=open(os.devnull, "w"))
    scan = fleet.scan_checks(
        rep, "cpu:0", tmp_path / "scan.db", budget=2, timeout=120, telemetry=("time",), only_idle=False
    )
    drill = fleet.drill_checks(rep, "cpu:0", tmp_path / "drill.db", budget=3, timeout=120, only_idle=False)
    assert not rep.failed, rep.failed
    assert scan["executions"] > 0 and scan["report"]["status"] == "healthy"
    assert drill["device"] == scan["device"] and drill["failures"] > 0


# --------------------------------------------------------------------------------------------- stand-in NVML

_UUID = "GPU-0badc0de-1111-2222-3333-444455556666"


class _NVMLError(Exception):
    pass


def _nvml(state: dict[str, Any], *, remapped: bool = True, xid: bool = True) -> Any:
    m = types.ModuleType("pynvml")
    names = [
        "NVML_TEMPERATURE_GPU",
        "NVML_CLOCK_SM",
        "NVML_CLOCK_MEM",
        "NVML_MEMORY_ERROR_TYPE_CORRECTED",
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
        "NVML_VOLATILE_ECC",
        "NVML_AGGREGATE_ECC",
        "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
        "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
        "nvmlEventTypeXidCriticalError",
    ]
    for i, name in enumerate(names):
        setattr(m, name, i)

    def unsupported(*_: Any) -> Any:
        raise _NVMLError("Not Supported")

    m.nvmlInit = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: _UUID
    m.nvmlDeviceGetSerial = lambda h: "1650000000001"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId="00000000:18:00.0")
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetTemperature = lambda h, sensor: 35
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980
    m.nvmlDeviceGetPowerUsage = lambda h: 90_000
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=state["util"], memory=0)
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    m.nvmlDeviceGetEccMode = lambda h: (1, 1)
    m.nvmlDeviceGetRetiredPages = unsupported
    m.nvmlDeviceGetRemappedRows = (lambda h: (0, 0, 0, 0)) if remapped else unsupported
    m.nvmlEventSetCreate = lambda: "events"
    m.nvmlDeviceRegisterEvents = (lambda h, kinds, events: None) if xid else unsupported
    m.nvmlEventSetWait_v2 = unsupported  # NVML_ERROR_TIMEOUT: no XID pending
    m.nvmlEventSetFree = lambda events: None
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=p) for p in state["pids"]]
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return m


def _fake_load(state: dict[str, Any]) -> Any:
    @contextlib.contextmanager
    def load() -> Iterator[int]:
        state.update(util=97, pids=[4242])
        try:
            yield 4242
        finally:
            state.update(util=0, pids=[])

    return load


def test_nvml_section_checks_discovery_idle_and_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_check.nvml_check import check_nvml

    state: dict[str, Any] = {"util": 0, "pids": []}
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(state))
    rep = SectionReport("nvml", stream=open(os.devnull, "w"))
    m = check_nvml(rep, 0, _UUID, _fake_load(state))
    assert not rep.failed, rep.failed
    assert "4242" in m["busy_reason"] and "4242" in m["job_appeared"]
    assert m["telemetry_after"]["xids"] == [] and m["telemetry_after"]["remap_failure"] is False


def test_nvml_section_fails_naming_missing_telemetry_and_a_wrong_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_check.nvml_check import check_nvml

    state: dict[str, Any] = {"util": 0, "pids": []}
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(state, remapped=False, xid=False))
    rep = SectionReport("nvml", stream=open(os.devnull, "w"))
    m = check_nvml(rep, 0, _UUID, _fake_load(state))
    assert [c.name for c in rep.failed] == ["telemetry holds the remapped rows", "telemetry holds the XID events"]
    assert m["probes"]["remapped rows"] == "_NVMLError: Not Supported"
    rep = SectionReport("nvml", stream=open(os.devnull, "w"))
    check_nvml(rep, 0, "GPU-00000000-0000-0000-0000-000000000000", _fake_load(state))
    assert [c.name for c in rep.failed] == ["cuda:0 is an NVML GPU under the same device id"]
