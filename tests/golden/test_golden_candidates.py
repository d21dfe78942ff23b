"""Per-architecture golden candidates: a device's intrinsics output is written, read back, and becomes a golden only
when two different devices agree; and the CUDA backend's seams that take and time it, on the host build."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sdcguard.errors import GoldenDataError
from sdcguard.golden import case_by_id, load_suite, verify
from sdcguard.golden.candidates import RULE, candidate, promote, read_candidates, write_candidates
from sdcguard.golden.hostbuild import HostBackend, HostBuild
from tests._golden import copy_golden

CASE = case_by_id("intrinsics.fp32.fast")


def _output(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(CASE.shape).astype(np.float32)


def test_a_candidate_file_round_trips_and_states_the_rule(tmp_path: Path) -> None:
    out = _output()
    path = write_candidates(tmp_path / "intrinsics-sm_90.json", [candidate(CASE, "sm_90", "GPU-a", out, model="H200")])
    body = json.loads(path.read_text())
    assert body["rule"] == RULE and "2 different devices" in RULE
    assert body["agreement"] == {"intrinsics.fp32.fast@sm_90": "agree"}
    (back,) = read_candidates(path)
    assert (back.case, back.arch, back.device, back.model) == (CASE, "sm_90", "GPU-a", "H200")
    assert np.array_equal(back.output.view(np.uint32), out.view(np.uint32))


def test_one_device_is_not_enough_however_often_it_ran(tmp_path: Path) -> None:
    d = copy_golden(tmp_path / "g")
    before = (d / "manifest.json").read_bytes()
    same = [candidate(CASE, "sm_90", "GPU-a", _output()) for _ in range(3)]
    with pytest.raises(GoldenDataError, match="1 device.*needs 2 different devices"):
        promote(same, d)
    assert (d / "manifest.json").read_bytes() == before


def test_two_devices_that_agree_make_a_golden_that_verifies_and_loads(tmp_path: Path) -> None:
    d = copy_golden(tmp_path / "g")
    a = write_candidates(tmp_path / "a.json", [candidate(CASE, "sm_90", "GPU-a", _output())])
    b = write_candidates(tmp_path / "b.json", [candidate(CASE, "sm_90", "GPU-b", _output())])
    (path,) = promote(read_candidates(a) + read_candidates(b), d)
    assert path == d / "intrinsics" / "sm_90" / "intrinsics.fp32.fast.bin"
    verify(d)
    suite = load_suite(d)
    assert suite.arch_cases("sm_90") == (CASE,)
    assert suite.arch_entries[(CASE.id, "sm_90")]["recorded_on"] == ["GPU-a", "GPU-b"]
    assert np.array_equal(suite.expected(CASE, "sm_90").view(np.uint32), _output().view(np.uint32))


def test_devices_that_disagree_record_nothing(tmp_path: Path) -> None:
    d = copy_golden(tmp_path / "g")
    before = (d / "manifest.json").read_bytes()
    other = _output()
    other.view(np.uint32)[2, 9] ^= 1
    with pytest.raises(GoldenDataError, match="disagree: GPU-a=.*GPU-b="):
        promote([candidate(CASE, "sm_90", "GPU-a", _output()), candidate(CASE, "sm_90", "GPU-b", other)], d)
    assert (d / "manifest.json").read_bytes() == before


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda b: b["candidates"][0].update(output_sha256="0" * 64), "does not match its output_sha256"),
        (lambda b: b["candidates"][0].update(output_base64="!!"), "not base64"),
        (lambda b: b["candidates"][0].update(inputs_sha256="0" * 64), "recorded from other inputs"),
        (lambda b: b["candidates"][0].update(case="intrinsics.fp64.nope"), "unknown case"),
        (lambda b: b["candidates"][0].update(arch="hopper"), "bad architecture"),
        (lambda b: b.update(format="something/9"), "not a candidates file"),
    ],
)
def test_a_damaged_candidate_file_is_one_clear_error_naming_it(tmp_path: Path, edit, message: str) -> None:
    path = write_candidates(tmp_path / "c.json", [candidate(CASE, "sm_90", "GPU-a", _output())])
    body = json.loads(path.read_text())
    edit(body)
    path.write_text(json.dumps(body))
    with pytest.raises(GoldenDataError, match=message) as e:
        read_candidates(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_only_gpu_only_cases_of_the_right_shape_are_candidates() -> None:
    with pytest.raises(GoldenDataError, match="portable golden"):
        candidate(case_by_id("alu.u32.chain"), "sm_90", "GPU-a", np.zeros(16384, np.uint32))
    with pytest.raises(GoldenDataError, match="the case defines"):
        candidate(CASE, "sm_90", "GPU-a", np.zeros((4, 4096), np.float32))


def test_the_inputs_of_a_case_recorded_for_no_architecture_rebuild_unchecked() -> None:
    suite = load_suite()
    assert not suite.arch_entries  # the repository holds no per-architecture golden yet
    assert set(suite.inputs(CASE)) >= {"x", "y"}


# ----------------------------------------------------------------------- the CUDA backend's seams, host build


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostBackend]:
    yield HostBackend(HostBuild(tmp_path_factory.mktemp("hostbuild")))


def test_output_returns_what_the_kernel_computed(host: HostBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdcguard.golden import CupyBackend
    from tests._fake_cupy import install

    install(monkeypatch, host.build)
    gpu = CupyBackend(0)
    got = gpu.output(CASE)
    assert got.shape == CASE.shape and got.dtype == np.float32
    want = host.execute(CASE)[1]["out"].reshape(CASE.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(gpu.output(CASE).view(np.uint32), got.view(np.uint32))
    with pytest.raises(Exception, match="cuBLAS"):
        gpu.output(case_by_id("gemm.fp32.int.cublas"))


def test_device_work_runs_the_launches_and_pins_cublas(host: HostBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdcguard.golden import CupyBackend
    from tests._fake_cupy import install

    log = install(monkeypatch, host.build)
    gpu = CupyBackend(0)
    gets = log["gets"]
    gpu.device_work(case_by_id("alu.u32.chain"))()
    gpu.device_work(case_by_id("gemm.tf32.int.cublas"))()
    assert log["gets"] == gets  # no copy to the host: only device work
    from cupy._core import _routines_linalg as linalg

    assert log["compute_types"][-2:] == [("float32", linalg.COMPUTE_TYPE_TF32), ("float32", 0)]
    assert gpu.run(case_by_id("alu.u32.chain")).passed  # the shared launch path still compares exactly
