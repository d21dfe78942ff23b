"""The checksums at a GPU's precision settings (handed to CPU tensors: what ``precision_for(..., cuda)`` and
``ChecksumMode(settings_of="cuda")`` read is the flags, not the device), and the settings read without raising.

- bf16 at torch's CUDA defaults (reduced-precision reductions allowed): the bound is finite at every ``k`` (split-K
  partial sums, not ``k`` roundings), so NaN and 1e30 are caught; a matmul whose bound is too wide for the claim is
  counted unverifiable and named, never checked;
- the new fp32 precision API (``torch.backends.cuda.matmul.fp32_precision = "tf32"``, mkldnn's, the generic one)
  is read, and a checked step trains under it;
- fp16 accumulation (``allow_fp16_accumulation``) is read: an fp16-accumulated product does not alarm;
- tensor-core accumulation (aligned to the largest exponent and truncated) never exceeds the bound;
- the check sends no host data to the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.overrides import TorchFunctionMode

from sdcguard import SDCGuard
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from sdcguard.training.checksums import (
    ChecksumMode,
    VacuousBound,
    check_matmul,
    fp32_internal,
    precision_for,
    unverifiable,
)
from tests._logs import expect_log, logged

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.fixture(autouse=True)
def restore_precision_flags() -> Iterator[None]:
    """Every flag a test sets goes back to torch's defaults after it (the new API's "none" included)."""
    matmul = torch.backends.cuda.matmul
    saved = (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction)
    fp16_acc = matmul.allow_fp16_accumulation
    yield
    torch.set_float32_matmul_precision("highest")  # writes "ieee" into each backend: then back to "none"
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.mkldnn.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "none"
    matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved
    matmul.allow_fp16_accumulation = fp16_acc


# ---------------------------------------------------------------------- bf16 with reduced-precision reductions


@pytest.mark.parametrize("k", [127, 256, 1024, 4096])
@pytest.mark.parametrize("bad", [float("nan"), 1e30])
def test_bf16_at_the_cuda_defaults_has_a_finite_bound_and_catches_nan_and_huge_values(k: int, bad: float) -> None:
    """It was infinite for k >= 127 (k roundings in bf16), so any result passed, NaN and 1e30 included."""
    p = precision_for(torch.bfloat16, CUDA)
    assert p is not None and p.u_red == 2.0**-8 and p.truncating
    g = torch.Generator().manual_seed(k)
    a, b = torch.randn(64, k, generator=g).bfloat16(), torch.randn(k, 32, generator=g).bfloat16()
    c = a @ b
    assert int(check_matmul(a, b, c, precision=p)) == 0
    c[5, 7] = bad
    assert int(check_matmul(a, b, c, precision=p)) == 1


def test_turning_reduced_precision_reductions_off_makes_bf16_checkable_at_32_rows() -> None:
    on = precision_for(torch.bfloat16, CUDA)
    assert on is not None
    why = unverifiable(on, torch.bfloat16, m=4096, k=4096)
    assert why is not None and "allow_bf16_reduced_precision_reduction=True" in why and "sign flip" in why
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # split-K partial sums then in fp32
    off = precision_for(torch.bfloat16, CUDA)
    assert off is not None and off.u_red == 0 and unverifiable(off, torch.bfloat16, m=4096, k=4096) is None
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    few = precision_for(torch.bfloat16, CUDA, splits=4)  # or a split count known for the GPU
    assert few is not None and unverifiable(few, torch.bfloat16, m=4096, k=4096) is None


def _model() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(d=16, heads=2, layers=1, seq=8, p=0.0)


def _bf16_step(mode: ChecksumMode, model: nn.Module, step: int, fault: OpFaultMode | None) -> list[Any]:
    with fault if fault is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        if fault is not None:
            fault.step = step
        mode.begin()  # above the fault's mode, as the guard pushes it: it sees the corrupted result
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = lm_loss(model, make_batch(step, 0))
            loss.backward()
        finally:
            failures = mode.end()
    model.zero_grad(set_to_none=True)
    return failures


def test_under_the_cuda_settings_bf16_forward_nan_faults_are_caught_and_nothing_is_counted_checked() -> None:
    """Under bf16 autocast with the CUDA precision NaN faults in the forward matmuls were caught 1 of 7 and every
    matmul counted checked; now 7 of 7, and the matmuls whose bound cannot see a sign flip are unverifiable."""
    model = _model()
    mode = ChecksumMode(model, settings_of="cuda")
    with expect_log("allow_bf16_reduced_precision_reduction=True"):
        assert _bf16_step(mode, model, 0, None) == []  # a clean step: no alarm
    run, checked, unverified = mode.run, mode.checked, mode.unverifiable
    # every matmul is checked or unverifiable; the attention bmms (8 rows each) are checkable, the rest are not
    assert run == 21 and checked + unverified == run and unverified == 15
    (line,) = mode.named()
    assert line.startswith(f"{unverified} matmul(s) with bfloat16 results under torch.backends.cuda.matmul.")
    caught = 0
    with logged() as said:
        for occurrence in range(7):
            fault = OpFaultMode(
                Fault(pattern="nan", timing="transient", seed=3), ops="matmul", phase="forward", occurrence=occurrence
            )
            caught += len(_bf16_step(mode, model, occurrence + 1, fault)) == 1 and len(fault.records) == 1
    assert caught == 7 and not [m for m in said if "unverifiable" in m]  # said once per setting, not per step


def test_the_step_report_counts_and_names_unverifiable_matmuls() -> None:
    torch.set_float32_matmul_precision("medium")  # fp32 matmuls may use bf16 internally: too wide at 32 rows
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    with expect_log(r"checksum_rows=\d+ would check it"):
        r = guard.step(0, make_batch(0, 0))
    assert r.commit and not r.incidents
    assert r.matmuls_checked == 0 and r.matmuls_unverifiable == r.matmuls_run > 0
    assert len(r.unverifiable) == 1 and "mkldnn.matmul.fp32_precision='bf16'" in r.unverifiable[0]
    torch.set_float32_matmul_precision("highest")
    r = guard.step(1, make_batch(1, 0))
    assert r.matmuls_checked == r.matmuls_run and r.matmuls_unverifiable == 0 and r.unverifiable == ()


def test_an_infinite_bound_is_refused_not_passed() -> None:
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_accumulation = True
    p = precision_for(torch.float16, CUDA)
    assert p is not None and p.u_acc == 2.0**-11
    a, b = torch.randn(8, 512).half(), torch.randn(512, 4).half()
    with pytest.raises(VacuousBound, match="allow_fp16_accumulation=True"):
        check_matmul(a, b, a @ b, precision=p)
    assert "infinite" in (unverifiable(p, torch.float16, m=8, k=512) or "")


# -------------------------------------------------------------------------------------- reading every flag


@pytest.mark.parametrize(
    ("setter", "device", "u_in"),
    [
        (lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"), CUDA, 2.0**-10),
        (lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"), CPU, 2.0**-7),
        (lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "tf32"), CPU, 2.0**-10),
        (lambda: setattr(torch.backends, "fp32_precision", "tf32"), CUDA, 2.0**-10),
        (lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True), CUDA, 2.0**-10),
        (lambda: torch.set_float32_matmul_precision("high"), CPU, 2.0**-10),
        (lambda: None, CUDA, 0.0),
    ],
)
def test_every_fp32_precision_flag_is_read_without_raising(setter: Any, device: torch.device, u_in: float) -> None:
    setter()
    p = precision_for(torch.float32, device)
    assert p is not None and p.u_in == u_in and p.u_ref == u_in
    assert fp32_internal(device.type)[0] in ("highest", "high", "medium")


def test_a_checked_step_trains_under_the_new_precision_api() -> None:
    """The legacy getter raises ("mix of the legacy and new APIs") once the new one was used: the checked step's
    forward raised with it, and without the guard the model trained."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    r = guard.step(0, make_batch(0, 0))
    assert r.commit and not r.incidents and r.matmuls_checked == r.matmuls_run > 0


# --------------------------------------------------------------------------------- what the backend computes


def _fp16_accumulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with every addition rounded to fp16 (``CUBLAS_COMPUTE_16F``), in the order of ``k``."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
    for i in range(a.shape[1]):
        acc = (acc.float() + (a[:, i : i + 1].float() * b[i : i + 1, :].float()).half().float()).half()
    return acc


def test_fp16_accumulation_is_read_and_its_products_do_not_alarm() -> None:
    """``allow_fp16_accumulation`` was never read: an fp16-accumulated product was judged against fp32
    accumulation and alarmed."""
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_accumulation = True
    g = torch.Generator().manual_seed(1)
    a, b = (torch.rand(64, 48, generator=g) + 0.5).half(), (torch.rand(48, 16, generator=g) + 0.5).half()
    c = _fp16_accumulated(a, b)
    p = precision_for(torch.float16, CUDA)
    assert p is not None and p.u_acc == 2.0**-11 and "allow_fp16_accumulation=True" in p.setting
    assert int(check_matmul(a, b, c, precision=p, rows=4)) == 0
    assert unverifiable(p, torch.float16, m=64, k=48) is not None  # at 32 rows too wide to claim a sign flip


def _truncate(x: np.ndarray, exponent: np.ndarray, bits: int = 24) -> np.ndarray:
    """``x`` truncated toward zero to a multiple of ``2**(exponent - bits + 1)``."""
    ulp = np.exp2(exponent - bits + 1)
    return np.trunc(x / ulp) * ulp


def _tensor_core_product(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """fp32 ``a @ b`` accumulated as NVIDIA tensor cores do (Fasi et al. 2021): each block of ``block`` exact
    products and the running sum aligned to their largest exponent and truncated to 24 bits, the sum truncated."""
    m, k = a.shape
    acc = np.zeros((m, b.shape[1]))
    for start in range(0, k, block):
        terms = [acc] + [np.outer(a[:, i], b[i, :]) for i in range(start, min(k, start + block))]  # exact in fp64
        largest = np.max([np.abs(t) for t in terms], axis=0)
        e = np.floor(np.log2(np.where(largest > 0, largest, 1.0)))
        total = np.sum([_truncate(t, e) for t in terms], axis=0)
        te = np.floor(np.log2(np.where(total != 0, np.abs(total), 1.0)))
        acc = _truncate(total, te)
    return acc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    m=st.integers(1, 40),
    k=st.integers(1, 200),
    n=st.integers(1, 12),
    block=st.sampled_from([1, 4, 8, 16]),
    kind=st.sampled_from(["positive", "normal", "tiny-tail"]),
    rows=st.sampled_from([1, 8, 32]),
    out=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_a_tensor_core_accumulation_never_exceeds_the_bound(
    seed: int, m: int, k: int, n: int, block: int, kind: str, rows: int, out: torch.dtype
) -> None:
    rng = np.random.default_rng(seed)
    if kind == "positive":
        a, b = rng.uniform(0.5, 1.5, (m, k)), rng.uniform(0.5, 1.5, (k, n))
    elif kind == "normal":
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    else:  # one large term then terms just under the running sum's last bit: truncation drops every one of them
        a, b = np.full((m, k), 2.0**-11), np.full((k, n), 2.0**-12 * 0.99)
        a[:, 0], b[0, :] = 1.0, 1.0
    at, bt = torch.from_numpy(a).float().to(out), torch.from_numpy(b).float().to(out)
    c = torch.from_numpy(_tensor_core_product(at.double().numpy(), bt.double().numpy(), block)).to(out)
    if out == torch.float32:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    p = precision_for(out, CUDA)
    assert p is not None
    assert int(check_matmul(at, bt, c, precision=p, rows=rows, screen=False)) == 0


class _Factories(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.host_data: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in ("tensor", "as_tensor", "from_numpy"):
            self.host_data.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("m", [40, 64])
def test_the_check_sends_no_host_data_to_the_device(m: int) -> None:
    """A bias row and a short last block made a ``torch.tensor([...], device=...)`` (a host-to-device copy, which
    waits for the host) in a path said never to synchronise."""
    a, b, bias = torch.randn(m, 8), torch.randn(8, 5), torch.randn(5)
    p = precision_for(torch.float32, CUDA)
    assert p is not None
    with _Factories() as seen:
        assert int(check_matmul(a, b, torch.addmm(bias, a, b), bias=bias, precision=p, screen=False)) == 0
    assert seen.host_data == []


def test_the_bound_of_a_reduced_reduction_grows_with_the_split_count_not_with_k() -> None:
    from sdcguard.training.checksums import bound

    p = precision_for(torch.bfloat16, CUDA, splits=8)
    assert p is not None
    wide, narrow = (bound._coefficients(p, 32, k, torch.float32)[0] for k in (10_000, 100))
    assert math.isfinite(wide) and wide < 2 * narrow  # k = 10,000 vs 100: the same few roundings in bf16
