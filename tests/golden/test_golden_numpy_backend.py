"""The numpy backend: every case passes on a healthy core; any flipped bit is reported in full."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.devices import cpu_id
from sdcguard.errors import NoDevice, SuiteError
from sdcguard.golden import NumpyBackend, case_by_id, default_suite
from tests._golden import bit_flip_hook

CORE = min(os.sched_getaffinity(0))
# one case per family (plus the odd dtypes): the injection tests cover every family and output width
FAMILY_CASES = [
    "gemm.fp32.int.cublas",
    "gemm.bf16.perm.mma",
    "gemm.fp64.perm.cublas",
    "alu.u32.chain",
    "alu.u64.chain",
    "ieee.fp32.cvt_fp16",
    "ieee.fp32.cvt_bf16",
    "ieee.fp64.div",
    "memory.u32.moving_inversions",
    "memory.u32.modulo20",
    "memory.u32.address",
    "memory.u32.random",
    "shared.u32.reduce",
    "shared.u64.bins",
]


@pytest.fixture(scope="module")
def backend() -> Iterator[NumpyBackend]:
    with NumpyBackend(CORE) as b:
        yield b


def test_every_case_passes_on_this_core(backend: NumpyBackend) -> None:
    cases = backend.cases()
    backend.prepare()
    assert {c.family for c in cases} == {"gemm", "alu", "ieee", "memory", "shared"}
    for case in cases:
        r = backend.run(case)
        assert r.passed, (case.id, r)
        assert r.device == cpu_id(CORE) and r.location == f"core:{CORE}"
        assert r.seed == case.seed and r.family == case.family
        assert r.output_digest == default_suite().entries[case.id]["output_sha256"]


def test_backend_pins_and_restores_affinity() -> None:
    before = os.sched_getaffinity(0)
    with NumpyBackend(CORE):
        assert os.sched_getaffinity(0) == {CORE}
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("case_id", FAMILY_CASES)
def test_injected_bit_flip_is_reported_in_full(backend: NumpyBackend, case_id: str) -> None:
    case = case_by_id(case_id)
    element = case.size // 3
    bit = 5
    r = backend.run(case, output_hook=bit_flip_hook(case_id, element, bit))
    assert not r.passed
    assert (r.case, r.seed, r.family) == (case.id, case.seed, case.family)
    assert r.element == element and r.mismatches == 1
    assert r.location == f"core:{CORE}" and r.device == backend.device
    assert int(r.xor_mask, 16) == 1 << bit
    assert int(r.expected, 16) ^ int(r.actual, 16) == 1 << bit
    assert len(r.expected) == 2 + 2 * np.dtype(case.out_dtype).itemsize
    expected = default_suite().expected(case).reshape(-1)
    assert int(r.expected, 16) == int(expected.view(f"u{expected.itemsize}")[element])
    assert r.output_digest is not None and r.output_digest != default_suite().entries[case.id]["output_sha256"]
    if case.family == "memory":
        # the hook corrupted a copy: the stored word reads back right, a transient read
        assert r.detail["stored_value_corrupt"] is False
        assert r.detail["second_read"] == r.expected
    # the next run without a hook passes again (no state leaks from a failure)
    assert backend.run(case).passed


@settings(max_examples=25)
@given(case_id=st.sampled_from(FAMILY_CASES), frac=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 63))
def test_any_single_bit_flip_is_caught(backend: NumpyBackend, case_id: str, frac: float, bit: int) -> None:
    case = case_by_id(case_id)
    bit %= 8 * np.dtype(case.out_dtype).itemsize
    element = int(frac * case.size)
    r = backend.run(case, output_hook=bit_flip_hook(case_id, element, bit))
    assert not r.passed and r.element == element and int(r.xor_mask, 16) == 1 << bit


def test_stored_memory_corruption_is_told_from_a_transient_read(backend: NumpyBackend) -> None:
    case = case_by_id("memory.u32.random")

    def corrupt_in_place(cid: str, out: np.ndarray) -> np.ndarray:
        out[1234] ^= np.uint32(1 << 31)  # the stored word itself is wrong
        return out

    r = backend.run(case, output_hook=corrupt_in_place)
    assert not r.passed and r.element == 1234
    assert r.detail["stored_value_corrupt"] is True and r.detail["address"].startswith("0x")


def test_gpu_only_and_bad_hooks_are_suite_errors(backend: NumpyBackend) -> None:
    with pytest.raises(SuiteError, match="GPU only"):
        backend.run(case_by_id("intrinsics.fp32.fast"))
    with pytest.raises(SuiteError, match="shape"):
        backend.run(case_by_id("alu.u32.chain"), output_hook=lambda cid, out: out[:-1])
    assert all(not c.gpu_only for c in backend.cases())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_backends_for_several_cores_in_one_thread() -> None:
    from sdcguard.golden.numpy_backend import _PROCESS_CPUS

    a, b = sorted(_PROCESS_CPUS)[:2]  # the module's backend may hold this thread on one core right now
    case = case_by_id("alu.u32.chain")
    with NumpyBackend(a) as first, NumpyBackend(b) as second:
        assert second.run(case).device == cpu_id(b) and os.sched_getaffinity(0) == {b}
        assert first.run(case).location == f"core:{a}" and os.sched_getaffinity(0) == {a}


def test_unavailable_core_is_no_device() -> None:
    with pytest.raises(NoDevice, match="not available"):
        NumpyBackend(10_000)


def test_march_read_failure_is_reported_with_its_second_read(
    backend: NumpyBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdcguard.golden import cpu_kernels

    real = cpu_kernels.same_bytes
    calls = {"n": 0}

    def decaying_cell(blk: np.ndarray, expect: np.ndarray) -> bool:
        calls["n"] += 1
        if calls["n"] == 2:  # the second block read back: a cell of it lost bit 4 since it was written
            blk[100] ^= np.uint32(0x10)
        return real(blk, expect)

    monkeypatch.setattr(cpu_kernels, "same_bytes", decaying_cell)
    case = case_by_id("memory.u32.moving_inversions")
    r = backend.run(case)
    block = case.params["block"]
    assert not r.passed and r.element == block + 100 and r.xor_mask == "0x00000010"
    assert r.detail["march"]["phase"] == "ascending" and r.detail["march"]["stored_value_corrupt"] is True
    assert r.location == f"core:{CORE}"
    assert r.output_digest != default_suite().entries[case.id]["output_sha256"]  # final contents were rewritten
