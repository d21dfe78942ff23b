"""Cross-replica checks on real DDP jobs over gloo: a flipped bit in one rank's reduced gradient or weights is
caught and attributed to that rank and parameter; clean training raises nothing; explicit groups (HSDP's
replicate dimension) compare within the group; sharded parameters are skipped and listed."""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks
from sdcguard.training.replica import minority

TIMEOUT = 240


def _flip_bit(t: Any, index: int, bit: int) -> None:
    """Flip one bit of element ``index`` of a float32 tensor in place (what a memory fault does)."""
    words = t.detach().view(-1).view(__import__("torch").int32)
    words[index] ^= (1 << bit) if bit < 31 else -(2**31)


def _model() -> Any:
    import torch

    torch.manual_seed(0)  # identical initial weights on every replica
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batch(step: int, rank: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data, as in data parallelism
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def _summary(incidents: list[Any]) -> list[tuple[str, int, tuple[int, ...], str | None, int]]:
    return [(i.kind, i.step, i.suspect_ranks, i.parameter, len(i.devices)) for i in incidents]


def _loop(rank: int, steps: int, weight_every: int, faults: dict[str, Any]) -> Any:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard.training.replica import ReplicaCheck

    ddp = DDP(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    check = ReplicaCheck(ddp)
    params = dict(check.module.named_parameters())
    found = []
    for step in range(steps):
        x, y = _batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # DDP all-reduces the gradients here
        g = faults.get("grad")
        if g and g["step"] == step and g["rank"] == rank:
            _flip_bit(params[g["param"]].grad, g["index"], g["bit"])
        incidents = check.check_gradients(step)
        found += incidents
        if not incidents:  # every rank sees the same verdict, so all skip the commit together
            opt.step()
        w = faults.get("weight")
        if w and w["step"] == step and w["rank"] == rank:
            _flip_bit(params[w["param"]].data, w["index"], w["bit"])
        if weight_every and step % weight_every == 0 or (w and w["step"] == step):
            incidents = check.check_weights(step)
            found += incidents
            if incidents and w and w["rank"] == rank:
                _flip_bit(params[w["param"]].data, w["index"], w["bit"])  # repair, so later steps are clean
    from sdcguard.devices import hostname
    from sdcguard.training.identity import local_device_id

    # what this rank says about itself must be what every rank was told at construction
    assert check.devices[rank] == local_device_id() and check.hosts[rank] == hostname()
    return _summary(found), check.devices, check.hosts


FAULTS = {
    "grad": {"step": 2, "rank": 1, "param": "2.weight", "index": 5, "bit": 3},
    "weight": {"step": 4, "rank": 2, "param": "0.bias", "index": 7, "bit": 30},
}


def _clean_then_faulty(rank: int, world_size: int) -> Any:
    """One job (process start-up is the slow part here): 100 clean steps, then a run with injected faults."""
    clean, _, _ = _loop(rank, 100, 10, {})
    faulty, devices, hosts = _loop(rank, 6, 0, FAULTS)
    return clean, faulty, devices, hosts


@pytest.fixture(scope="module")
def ddp_job() -> list[Any]:
    return run_ranks(_clean_then_faulty, 3, timeout=TIMEOUT)


@pytest.mark.distributed
def test_a_flipped_gradient_bit_and_a_flipped_weight_bit_are_attributed_to_their_rank_and_parameter(
    ddp_job: list[Any],
) -> None:
    expected = [("gradient_replica", 2, (1,), "2.weight", 1), ("weight_replica", 4, (2,), "0.bias", 1)]
    for _, found, devices, hosts in ddp_job:  # every rank reached the same verdict
        assert found == expected
        assert len(devices) == len(hosts) == 3  # one device id per rank, each checked by its own rank
        assert all(d.startswith("cpu:") for d in devices)


@pytest.mark.distributed
def test_one_hundred_clean_steps_raise_nothing(ddp_job: list[Any]) -> None:
    assert [r[0] for r in ddp_job] == [[], [], []]


@pytest.fixture(scope="module")
def mesh_job() -> list[Any]:
    return run_ranks(_explicit_groups, 4, timeout=TIMEOUT)


def _explicit_groups(rank: int, world_size: int) -> Any:
    """4 ranks as a 2x2 HSDP mesh: replicate groups {0,2} and {1,3}; the two groups hold different 'shards'."""
    import torch
    import torch.distributed as dist

    from sdcguard.training.replica import ReplicaCheck

    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank creates every group, same order
    group = groups[rank % 2]
    torch.manual_seed(rank % 2)  # shard 0 on ranks 0,2; shard 1 on ranks 1,3
    model = torch.nn.Linear(6, 5)
    check = ReplicaCheck(model, group=group)
    clean = check.check_weights(0)
    if rank == 2:
        _flip_bit(model.weight.data, 11, 31)
    flipped = check.check_weights(1)
    return _summary(clean), _summary(flipped), _sharded_skip(world_size)


@pytest.mark.distributed
def test_an_explicit_replicate_group_compares_within_the_group_and_two_replicas_are_both_suspects(
    mesh_job: list[Any],
) -> None:
    for rank, (clean, flipped, _) in enumerate(mesh_job):
        assert clean == []
        if rank % 2 == 0:
            assert flipped == [("weight_replica", 1, (0, 2), "weight", 2)]  # global ranks, both suspects
        else:
            assert flipped == []


def _sharded_skip(world_size: int) -> Any:
    import warnings

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from sdcguard.training.replica import ReplicaCheck

    mesh = init_device_mesh("cpu", (world_size,))
    model = torch.nn.Linear(4, 4)
    model.weight = torch.nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Shard(0)]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check = ReplicaCheck(model)
    return check.names, check.skipped, [str(w.message) for w in caught]


@pytest.mark.distributed
def test_sharded_parameters_are_skipped_and_said_so(mesh_job: list[Any]) -> None:
    for _, _, (names, skipped, messages) in mesh_job:
        assert names == ("bias",)
        assert skipped == ("weight",)
        assert any("not compared" in m and "weight" in m for m in messages)


def test_majority_vote() -> None:
    assert minority([5, 5, 5]) == []
    assert minority([5, 7, 5]) == [1]
    assert minority([5, 7, 5, 7]) == [0, 1, 2, 3]  # no strict majority: every rank is a suspect
    assert minority([5, 7]) == [0, 1]  # two replicas: both suspects
    assert minority([1, 2, 3]) == [0, 1, 2]


def test_cpu_device_ids_name_the_pinned_core_or_the_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from sdcguard.devices import cpu_id
    from sdcguard.training.identity import local_device_id

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 6}, raising=False)
    assert local_device_id() == cpu_id(5)  # pinned to a subset: its lowest core
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device_id() == cpu_id(3)  # unpinned: the local rank stands in for a core


def _sparse_gradient(rank: int, world_size: int) -> Any:
    import warnings

    import torch

    from sdcguard.training.replica import ReplicaCheck

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(10, 3, sparse=True), "lin": torch.nn.Linear(3, 2)})
    check = ReplicaCheck(model)
    model["lin"](model["emb"](torch.tensor([1, 2]))).sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        incidents = check.check_gradients(0)  # must not raise (a raise would strand the other ranks)
    return _summary(incidents), [str(w.message) for w in caught]


@pytest.mark.distributed
def test_a_sparse_gradient_is_reported_not_raised() -> None:
    [(incidents, messages)] = run_ranks(_sparse_gradient, 1, timeout=TIMEOUT)
    assert incidents == []
    assert any("non-dense" in m and "emb.weight" in m for m in messages)
