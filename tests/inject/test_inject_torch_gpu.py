"""Faults on CUDA tensors: the same plan as on the host, written with torch indexing on the device."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sdcguard.inject import Fault, FaultModel  # noqa: E402
from sdcguard.inject.torch_faults import OpFaultMode, corrupt_tensor_  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="gpu test: this torch build has no CUDA device"),
]

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    return t.view(_INT[t.element_size()]).reshape(-1).numpy().view(f"u{t.element_size()}").astype(np.uint64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int32])
@pytest.mark.parametrize("value_range", [None, (-0.5, 0.5)])
def test_cuda_tensor_gets_exactly_the_host_plan(dtype, value_range):
    fault = Fault(pattern="mix", elements=9, control=0.3, value_range=value_range, seed=5)
    host = torch.randn(67, 45).to(dtype)
    dev = host.cuda().t()  # non-contiguous on the device
    expected, np_records = FaultModel(fault).corrupt_array(
        _bits(host.t()).astype(f"u{host.element_size()}").reshape(45, 67), dtype=str(dtype)[6:]
    )
    records = corrupt_tensor_(dev, FaultModel(fault))
    assert [(r.index, r.before, r.after) for r in records] == [(r.index, r.before, r.after) for r in np_records]
    assert np.array_equal(_bits(dev), expected.reshape(-1).astype(np.uint64))


def test_op_mode_on_cuda_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).cuda()
    x = torch.randn(8, 16, device="cuda")
    for phase in ("forward", "backward"):
        mode = OpFaultMode(Fault(pattern="bitflip", bit="exponent"), ops="matmul", phase=phase, occurrence=0)
        with mode:
            model(x).sum().backward()
        assert len(mode.records) == 1 and mode.records[0].phase == phase
