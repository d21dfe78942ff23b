"""The CuPy backend on a real GPU (skipped without one, with the reason): every case against the goldens, and
injected flips located on an SM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdcguard.devices import device_kind
from sdcguard.errors import NoDevice
from sdcguard.golden import case_by_id
from tests._golden import bit_flip_hook

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu() -> Iterator[object]:
    from sdcguard.golden import CupyBackend

    yield CupyBackend(0)


def test_every_case_passes_on_gpu0(gpu) -> None:
    assert device_kind(gpu.device) == "gpu"
    failures = [r for r in (gpu.run(c) for c in gpu.cases()) if not r.passed]
    assert not failures, failures


@pytest.mark.parametrize(
    "case_id", ["gemm.bf16.perm.mma", "alu.u32.chain", "ieee.fp64.div", "memory.u32.random", "shared.u32.reduce"]
)
def test_injected_flip_names_the_sm(gpu, case_id: str) -> None:
    case = case_by_id(case_id)
    r = gpu.run(case, output_hook=bit_flip_hook(case_id, 5, 7))
    assert not r.passed and r.element == 5 and int(r.xor_mask, 16) == 1 << 7
    assert r.location.startswith("sm:") and r.location != "sm:*"


def test_cublas_case_reports_the_element(gpu) -> None:
    r = gpu.run(case_by_id("gemm.fp32.int.cublas"), output_hook=bit_flip_hook("gemm.fp32.int.cublas", 300, 0))
    assert not r.passed and r.element == 300 and r.detail["row"] == 2


def test_memory_share_marches_more_than_the_golden(gpu) -> None:
    from sdcguard.golden import CupyBackend

    big = CupyBackend(0, memory_share=0.05)
    r = big.run(case_by_id("memory.u32.moving_inversions"))
    assert r.passed and r.detail["words"] >= case_by_id("memory.u32.moving_inversions").size


def test_missing_device_is_no_device() -> None:
    from sdcguard.golden import CupyBackend

    with pytest.raises(NoDevice):
        CupyBackend(10_000)
