"""Collective and rank-targeted faults across real processes over gloo: only the chosen rank is corrupted."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from sdcguard.testing import run_ranks  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORLD = 2


def _bits(t) -> np.ndarray:
    return t.detach().contiguous().view(torch.int32).reshape(-1).numpy().view(np.uint32).copy()


def _ddp_comm_hook_and_op_mode(rank: int, world_size: int) -> dict:
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import CorruptingCommHook, OpFaultMode, corrupt_all_reduce

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    hook = CorruptingCommHook(Fault(pattern="bitflip", bit="exponent", elements=2, seed=3), rank=1, steps=[1])
    ddp.register_comm_hook(state=None, hook=hook)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    out = {"grads": [], "records": []}
    for step in range(3):
        hook.step = step
        ddp.zero_grad()
        ddp(x).sum().backward()
        out["grads"].append(np.concatenate([_bits(p.grad) for p in model.parameters()]))
    out["records"] = [r.to_dict() for r in hook.records]

    # the op mode on rank 1 only: rank 0's forward is bit-identical to a run without the mode
    mode = OpFaultMode(Fault(pattern="zero", elements=3), ops="matmul", phase="forward", rank=1)
    with torch.no_grad():
        clean = model(x)
        with mode:
            seen = model(x)
    out["op_changed"] = bool((_bits(clean) != _bits(seen)).any())
    out["op_records"] = [r.to_dict() for r in mode.records]

    t = torch.arange(8, dtype=torch.float32) + 1
    records = corrupt_all_reduce(t, Fault(pattern="nan"), rank=0)
    out["all_reduce"] = _bits(t)
    out["all_reduce_records"] = [r.to_dict() for r in records]
    return out


def test_one_rank_is_corrupted_and_the_others_are_not():
    r0, r1 = run_ranks(_ddp_comm_hook_and_op_mode, WORLD, timeout=90)
    # comm hook: the reduced gradients agree at steps 0 and 2 and differ on rank 1 at step 1, exactly as recorded
    assert np.array_equal(r0["grads"][0], r1["grads"][0]) and np.array_equal(r0["grads"][2], r1["grads"][2])
    assert r0["records"] == [] and r1["records"]
    assert {rec["step"] for rec in r1["records"]} == {1} and {rec["rank"] for rec in r1["records"]} == {1}
    diff = np.flatnonzero(r0["grads"][1] != r1["grads"][1])
    assert diff.size == len([rec for rec in r1["records"] if rec["xor"]]) > 0
    for rec in r1["records"]:
        assert rec["target"].startswith("comm_hook:bucket")
    # op mode: only on rank 1
    assert not r0["op_changed"] and r0["op_records"] == []
    assert r1["op_changed"] and {rec["rank"] for rec in r1["op_records"]} == {1}
    # all_reduce: the sum is right on rank 1, one NaN on rank 0
    expected = (2 * (np.arange(8, dtype=np.float32) + 1)).view(np.uint32)
    assert np.array_equal(r1["all_reduce"], expected) and r1["all_reduce_records"] == []
    (rec,) = r0["all_reduce_records"]
    assert np.flatnonzero(r0["all_reduce"] != expected).tolist() == [rec["index"]]
    assert np.isnan(r0["all_reduce"].view(np.float32)[rec["index"]])
