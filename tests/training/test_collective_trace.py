"""The collective tracer (:mod:`sdcguard.training.replay.collectives`) over gloo, three real processes: what a rank puts
into each collective of its unit is fingerprinted in call order (functional and c10d collectives, DTensor's
redistributions), and nothing else: not a collective over a group reaching outside the unit, not a broadcast's
buffers, not a collective issued while it is not tracing."""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks

pytestmark = pytest.mark.distributed


def _job(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from sdcguard.fingerprints import fingerprint
    from sdcguard.training.digest import LocalRecord
    from sdcguard.training.replay.collectives import unit_tracer

    unit = dist.new_group([0, 1])  # every rank creates every group
    assert unit_tracer([rank]) is None
    tracer = unit_tracer([0, 1] if rank < 2 else [2])
    record = LocalRecord(1, torch.device("cpu"))
    x = torch.arange(4, dtype=torch.float32) + rank
    y = torch.arange(6, dtype=torch.float32) * (rank + 1)
    expected: list[int] = []
    if rank < 2:
        assert tracer is not None
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        with tracer.tracing(record):
            funcol.wait_tensor(funcol.all_reduce(x, "sum", unit))  # functional: traced
            out = torch.empty(4)
            dist.all_to_all_single(out, y[:4].clone(), group=unit)  # c10d: traced
            dist.all_reduce(x.clone())  # the whole job: outside the unit
            dist.broadcast(torch.zeros(3) if rank else y[:3].clone(), src=0, group=unit)  # a root's, not a contribution
            d = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
            d.redistribute(mesh, [Replicate()]).to_local()  # DTensor's all-gather: traced
        dist.all_reduce(x.clone(), group=unit)  # after tracing: not traced
        expected = [fingerprint(x), fingerprint(y[:4]), fingerprint(torch.ones(2, 2))]
    else:
        dist.all_reduce(x.clone())
    trace = record.digest().trace
    return {"trace": list(trace), "expected": expected}


@pytest.mark.timeout(120)
def test_a_rank_traces_what_it_put_into_its_units_collectives_and_nothing_else() -> None:
    results = run_ranks(_job, 3, timeout=100)
    for r in results[:2]:
        assert r["trace"] == r["expected"], r
    assert results[0]["trace"][0] != results[1]["trace"][0]  # each rank's own contribution
    assert results[2]["trace"] == []
