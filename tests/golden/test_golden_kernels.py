"""The CUDA kernels without a GPU: every file compiles with NVRTC for sm_80 and sm_90, and the same source built
for the host (g++ + kernels/host/cuda_host.h) reproduces every golden and reports injected faults with their SM."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sdcguard.errors import SuiteError
from sdcguard.golden import case_by_id, default_suite
from sdcguard.golden.hostbuild import HostBackend, HostBuild, entry_points, kernel_files
from sdcguard.golden.kernel_run import kernel_case_result
from sdcguard.golden.launch import plan_for, runs_on_kernels
from sdcguard.kernels import kernel_source, kernel_sources
from tests._golden import bit_flip_hook

KERNEL_FILES = [p.name for p in kernel_files()]
"""The golden-vector kernels."""
ALL_SOURCES = kernel_sources()
"""Every CUDA source the project compiles: the golden kernels and the fingerprint's."""


def _nvrtc_reason() -> str | None:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # not installed, or the NVRTC library is missing
        return f"NVRTC not importable: {type(e).__name__}: {e}"
    return None


def test_every_kernel_file_is_known() -> None:
    assert set(KERNEL_FILES) == {"alu.cu", "gemm_mma.cu", "ieee.cu", "intrinsics.cu", "memory.cu", "shared.cu"}
    assert set(ALL_SOURCES) == {*KERNEL_FILES, "fingerprint/chunk_sums.cu"}
    for name in KERNEL_FILES:
        src = kernel_source(name)
        assert src.startswith(f'#line 1 "{Path(kernel_files()[0]).parent / name}"\n')
        assert entry_points(Path(kernel_files()[0]).parent / name)


@pytest.mark.skipif(_nvrtc_reason() is not None, reason=_nvrtc_reason() or "")
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
@pytest.mark.parametrize("name", ALL_SOURCES)
def test_nvrtc_compiles_every_kernel(name: str, arch: str) -> None:
    from sdcguard.kernels import compile_ptx
    from sdcguard.resources import kernels_dir

    ptx = compile_ptx(name, arch)
    assert f".target sm_{arch.split('_')[1]}" in ptx
    for entry in entry_points(kernels_dir() / name):
        assert re.search(rf"\.entry {entry}\(", ptx), f"{entry} missing from the PTX of {name}"
    if name == "gemm_mma.cu":
        assert ptx.count("mma.sync.aligned") >= 3  # f16, bf16, tf32 tensor-core paths
        # e4m3 tensor cores exist from sm_89: only the sm_90 build carries the fp8 product
        assert ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in ptx) == (arch == "compute_90")


@pytest.mark.skipif(_nvrtc_reason() is not None, reason=_nvrtc_reason() or "")
def test_nvrtc_errors_name_the_real_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdcguard import kernels

    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k() { undeclared_thing(); }\n')
    monkeypatch.setattr(kernels, "kernels_dir", lambda: tmp_path)
    with pytest.raises(SuiteError, match=r"broken\.cu"):
        kernels.compile_ptx("broken.cu")


# --------------------------------------------------------------------------------------------------- host build


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostBackend]:
    build = HostBuild(tmp_path_factory.mktemp("hostbuild"))
    yield HostBackend(build)


HOST_CASES = [c.id for c in default_suite().cases if runs_on_kernels(c)]


@pytest.mark.slow
def test_host_build_covers_every_kernel(host: HostBackend) -> None:
    launched = set()
    for cid in HOST_CASES:
        case = case_by_id(cid)
        launched |= {launch.kernel for launch in plan_for(case, default_suite().inputs(case), sm_count=2).launches}
    launched.add(plan_for(case_by_id("intrinsics.fp32.fast"), {}, sm_count=2).launches[0].kernel)
    assert launched == set(host.build.kernels), "a kernel no case launches is not covered by the host build"


@pytest.mark.slow
@pytest.mark.parametrize("case_id", HOST_CASES)
def test_host_build_reproduces_the_golden(host: HostBackend, case_id: str) -> None:
    r = host.run(case_by_id(case_id))
    assert r.passed, r


@pytest.mark.slow
@pytest.mark.parametrize(
    "case_id",
    [
        "gemm.fp16.perm.mma",
        "gemm.tf32.int.mma",
        "alu.u64.chain",
        "ieee.fp32.fma",
        "ieee.fp32.cvt_bf16",
        "memory.u32.address",
        "shared.u32.reduce",
        "shared.u64.bins",
    ],
)
def test_host_build_reports_an_injected_flip_with_its_sm(host: HostBackend, case_id: str) -> None:
    case = case_by_id(case_id)
    element, bit = case.size // 2 + 1, 3
    r = host.run(case, output_hook=bit_flip_hook(case_id, element, bit))
    assert not r.passed and (r.case, r.seed) == (case.id, case.seed)
    assert r.element == element and r.mismatches == 1 and int(r.xor_mask, 16) == 1 << bit
    assert int(r.expected, 16) ^ int(r.actual, 16) == 1 << bit
    plan = host.plan(case)
    block = plan.element_block(element)
    if block is None:  # a histogram or total: every block contributed
        assert r.location == "sm:*" and r.detail["sms"]
    else:
        # smids holds one slot per block of every launch; the host's fake SM id is the launch-local block index
        local = block % plan.launches[0].blocks
        assert r.location == f"sm:{local % host.build.fake_sms}"


@pytest.mark.slow
def test_host_build_march_catches_a_stored_fault_with_a_second_read(host: HostBackend) -> None:
    case = case_by_id("memory.u32.moving_inversions")
    inputs = default_suite().inputs(case)
    plan = plan_for(case, inputs, sm_count=2)
    buffers = {name: np.zeros(n, dtype=dt) for name, (dt, n) in plan.scratch.items()}
    host.build.launch(plan.launches[0], buffers)  # write the pattern
    buffers["out"][777] ^= np.uint32(0x10)  # a cell that lost its value
    for launch in plan.launches[1:]:
        host.build.launch(launch, buffers)
    r = kernel_case_result(
        case=case,
        plan=plan,
        expected=default_suite().expected(case),
        golden_digest="",
        host=buffers,
        output_hook=None,
        device="host-build",
        started=0.0,
        duration=0.0,
    )
    assert not r.passed and r.element == 777 and r.xor_mask == "0x00000010"
    march = r.detail["march"]
    assert march["phase"] == "ascending" and march["count"] == 1
    assert march["second_read"] == r.actual and march["stored_value_corrupt"] is True
    assert r.location == f"sm:{march['sm']}"
    # the march rewrote the word, so the final contents are right again: only the march saw it
    assert r.mismatches == 1
    # ...and its digest still differs from the golden's: equal digests on two devices mean the same wrong answer
    assert r.output_digest != default_suite().entries[case.id]["output_sha256"]


@pytest.mark.slow
def test_host_build_intrinsics_kernel_logic(host: HostBackend) -> None:
    # GPU intrinsics have per-architecture goldens; on the host the libm stand-ins must match float64 math closely
    case = case_by_id("intrinsics.fp32.fast")
    plan, scratch = host.execute(case)
    from sdcguard.golden.inputs import make_inputs

    inp = make_inputs(case)
    x, y = inp["x"].astype(np.float64), inp["y"].astype(np.float64)
    out = scratch["out"].reshape(5, -1).astype(np.float64)
    for row, want in enumerate([np.exp(x), np.log(y), np.sin(x), np.cos(x), x / y]):
        assert np.allclose(out[row], want, rtol=1e-6, atol=1e-6), row
    assert set(scratch["smids"]) <= set(range(host.build.fake_sms))


@pytest.mark.slow
def test_per_architecture_goldens_record_verify_and_run(host: HostBackend, tmp_path: Path) -> None:
    from sdcguard.errors import GoldenDataError
    from sdcguard.golden import generate, load_suite, verify
    from sdcguard.golden.suite import record_arch_golden
    from tests._golden import copy_golden, flip_byte

    d = copy_golden(tmp_path)
    case = case_by_id("intrinsics.fp32.fast")
    arch = HostBackend.arch
    runs = [host.execute(case)[1]["out"].reshape(case.shape).copy() for _ in range(2)]
    with pytest.raises(GoldenDataError, match="needs 2 reference devices"):
        record_arch_golden(d, case, arch, [("dev0", runs[0])])
    wrong = runs[1].copy()
    wrong.view(np.uint32)[0, 7] ^= 1
    with pytest.raises(GoldenDataError, match="disagree"):
        record_arch_golden(d, case, arch, [("dev0", runs[0]), ("dev1", wrong)])
    path = record_arch_golden(d, case, arch, [("dev0", runs[0]), ("dev1", runs[1])])
    assert path == d / "intrinsics" / arch / "intrinsics.fp32.fast.bin"
    verify(d)
    generate(d)  # regenerating the portable data keeps the recorded golden
    verify(d)
    suite = load_suite(d)
    assert suite.arch_cases(arch) == (case,) and case not in suite.cases
    backend = HostBackend(host.build, suite=suite)
    assert backend.run(case).passed
    r = backend.run(case, output_hook=bit_flip_hook(case.id, 4096 + 300, 2))  # row 1 (__logf), element 300
    assert not r.passed and r.element == 4096 + 300 and r.location.startswith("sm:")
    flip_byte(path, 10)
    with pytest.raises(GoldenDataError, match="intrinsics.fp32.fast.bin"):
        verify(d)


# ------------------------------------------------------------------- CupyBackend's own code, on the host build

FAKE_GPU_CASES = [
    "gemm.fp64.int.cublas",
    "gemm.fp32.perm.cublas",
    "gemm.tf32.int.cublas",
    "gemm.fp16.int.cublas",
    "gemm.bf16.int.mma",
    "alu.u32.chain",
    "ieee.fp64.fma",
    "ieee.fp32.cvt_fp16",
    "memory.u32.modulo20",
    "memory.u32.random",
    "shared.u64.bins",
]


@pytest.fixture()
def fake_gpu(host: HostBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, dict]]:
    from sdcguard.golden import CupyBackend
    from tests._fake_cupy import install

    log = install(monkeypatch, host.build)
    yield CupyBackend(0), log


@pytest.mark.slow
def test_cupy_backend_runs_every_family_with_one_host_sync(fake_gpu) -> None:
    gpu, log = fake_gpu
    assert gpu.device == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f" and gpu.arch == "sm_90"
    assert case_by_id("intrinsics.fp32.fast") not in gpu.cases()  # no golden recorded for sm_90 here
    gpu.prepare(tuple(case_by_id(c) for c in FAKE_GPU_CASES))
    for cid in FAKE_GPU_CASES:
        before = log["gets"]
        r = gpu.run(case_by_id(cid))
        assert r.passed, r
        assert log["gets"] == before + 1, f"{cid}: {log['gets'] - before} host syncs"
    # cuBLAS's compute type is pinned per dtype and put back afterwards
    from cupy._core import _routines_linalg as linalg

    assert ("float64", linalg.COMPUTE_TYPE_FP64) in log["compute_types"]
    assert ("float32", linalg.COMPUTE_TYPE_PEDANTIC) in log["compute_types"]
    assert ("float32", linalg.COMPUTE_TYPE_TF32) in log["compute_types"]
    assert ("float16", linalg.COMPUTE_TYPE_FP32) in log["compute_types"]
    assert linalg.get_compute_type(np.float32) == 0 and linalg.get_compute_type(np.float16) == 0


@pytest.mark.slow
@pytest.mark.parametrize("case_id", ["alu.u32.chain", "memory.u32.random", "gemm.fp32.int.cublas"])
def test_cupy_backend_reports_flips_with_sm_and_second_read(fake_gpu, case_id: str) -> None:
    gpu, _ = fake_gpu
    case = case_by_id(case_id)
    r = gpu.run(case, output_hook=bit_flip_hook(case_id, 4100, 9))
    assert not r.passed and r.element == 4100 and r.xor_mask.endswith("200") and r.device == gpu.device
    if case_id.endswith("cublas"):
        assert r.location == "sm:unknown" and (r.detail["row"], r.detail["col"]) == divmod(4100, case.shape[1])
    else:
        assert re.fullmatch(r"sm:\d+", r.location)
    if case.family == "memory":
        assert r.detail["stored_value_corrupt"] is False and r.detail["second_read"] == r.expected


@pytest.mark.slow
def test_cupy_backend_marches_a_share_of_free_memory(host: HostBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdcguard.golden import CupyBackend
    from tests._fake_cupy import install

    install(monkeypatch, host.build)
    gpu = CupyBackend(0, memory_share=0.25)  # the fake reports 64 MiB free: a 16 MiB march, golden on 8 MiB
    case = case_by_id("memory.u32.moving_inversions")
    r = gpu.run(case)
    assert r.passed and r.detail["words"] == (16 << 20) // 4 > case.size
