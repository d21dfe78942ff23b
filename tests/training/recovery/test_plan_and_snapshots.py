"""The recovery's pure parts: the job-wide plan (who leaves, which spare is promoted, who goes on, in which order),
the vote over snapshot states, and verified snapshots (double-buffered host copies whose restore is exact and
never changed by training on)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.errors import BadInput
from sdcguard.training.recovery.plan import plan_recovery
from sdcguard.training.recovery.snapshot import SnapshotKeeper
from sdcguard.training.recovery.state import LiveState, flatten, unflatten
from sdcguard.training.recovery.vote import confirmed, holders


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[int], list[int], set[int], int | None, set[int]]:
    world = draw(st.integers(2, 9))
    ranks = list(range(world))
    shadows = sorted(draw(st.sets(st.sampled_from(ranks), max_size=world - 1)))
    workers = [r for r in ranks if r not in shadows]
    suspects = draw(st.sets(st.integers(0, world + 2), max_size=3))
    min_replicas = draw(st.none() | st.integers(1, world))
    undecided = draw(st.just(set()) | st.sets(st.sampled_from(ranks), min_size=2, max_size=3))
    return workers, shadows, suspects, min_replicas, undecided


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_the_plan_never_sends_a_healthy_rank_away_and_keeps_enough_replicas(
    job: tuple[list[int], list[int], set[int], int | None, set[int]],
) -> None:
    workers, shadows, suspects, min_replicas, undecided = job
    plan = plan_recovery(7, workers, shadows, suspects, min_replicas=min_replicas, undecided=undecided)
    if undecided - suspects:  # an unresolved verdict's suspect nobody settled: nobody healthy may be sent away
        assert plan.action == "exit"
    assert set(plan.leavers) <= suspects and set(plan.leavers) <= set(workers) | set(shadows)
    assert not set(plan.members) & set(plan.leavers)
    assert list(plan.members) == sorted(plan.members)  # the order the new group sums in: data ranks follow it
    assert set(plan.promoted) <= set(shadows) - set(plan.leavers)
    for r in [*workers, *shadows]:
        assert plan.status(r) == (86 if r in plan.leavers else 85)
    if plan.action == "reform":
        assert plan.members and (len(plan.members) == len(workers) or len(plan.members) >= (min_replicas or 10**9))
        assert set(plan.members) == (set(workers) - set(plan.leavers)) | set(plan.promoted)
        assert [plan.data_rank(m) for m in plan.members] == list(range(len(plan.members)))
    else:
        assert plan.members == () and plan.promoted == ()


def test_a_spare_takes_the_leavers_place_and_the_data_ranks_follow_the_groups_order() -> None:
    plan = plan_recovery(9, [0, 1, 2], [3], {1}, min_replicas=None)
    assert (plan.action, plan.leavers, plan.members, plan.promoted) == ("reform", (1,), (0, 2, 3), (3,))
    assert [plan.data_rank(r) for r in (0, 2, 3)] == [0, 1, 2]
    assert plan_recovery(9, [0, 1, 2], [], {1}, min_replicas=None).action == "exit"  # no spare, no smaller job
    assert plan_recovery(9, [0, 1, 2], [], {1}, min_replicas=2).members == (0, 2)
    assert plan_recovery(9, [0, 1], [], {0, 1}, min_replicas=1).action == "exit"  # nobody left


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(2, 4), st.sets(st.integers(0, 16), max_size=3), st.none() | st.integers(1, 4))
def test_an_hsdp_replica_leaves_whole_and_only_its_suspects_leave_as_suspects(
    shards: int, rows: int, suspects: set[int], min_replicas: int | None
) -> None:
    replicas = [tuple(range(r * shards, (r + 1) * shards)) for r in range(rows)]
    workers = [w for row in replicas for w in row]
    plan = plan_recovery(7, workers, [], suspects, min_replicas=min_replicas, replicas=replicas)
    hit = [row for row in replicas if set(row) & suspects]
    assert set(plan.leavers) == suspects & set(workers)
    assert set(plan.released) == {r for row in hit for r in row} - suspects  # healthy ranks of a leaving replica
    assert all(plan.status(r) == 85 for r in plan.released)
    kept = len(replicas) - len(hit)
    if plan.action == "reform":
        assert kept == rows or kept >= (min_replicas or 10**9)
        assert plan.members == tuple(w for row in replicas if row not in hit for w in row)  # whole rows, in order
    else:
        assert not kept or (kept < rows and kept < (min_replicas or 10**9))
    assert plan.promoted == ()


def test_an_hsdp_job_without_min_replicas_exits_and_one_with_it_goes_on_as_two_replicas() -> None:
    replicas = [(0, 1), (2, 3), (4, 5)]
    workers = [0, 1, 2, 3, 4, 5]
    assert plan_recovery(4, workers, [], {2}, min_replicas=None, replicas=replicas).action == "exit"
    plan = plan_recovery(4, workers, [], {2}, min_replicas=2, replicas=replicas)
    assert (plan.action, plan.leavers, plan.released, plan.members) == ("reform", (2,), (3,), (0, 1, 4, 5))
    assert plan_recovery(4, workers, [], {2, 5}, min_replicas=2, replicas=replicas).action == "exit"


def test_the_vote_takes_the_newest_state_a_strict_majority_holds() -> None:
    assert confirmed([(5, 1), (5, 1), (5, 2)], voters=3) == (5, 1)
    assert confirmed([(5, 1), (6, 9), None], voters=3) is None  # no majority
    assert confirmed([(5, 1), (5, 1), (6, 9), (6, 9), (6, 9)], voters=5) == (6, 9)
    assert confirmed([(5, 1), None], voters=2) is None  # one copy of two is no majority
    assert holders([(5, 1), None, (5, 1)], (5, 1)) == [0, 2]


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=2), kids, max_size=3),
                    max_leaves=8))  # fmt: skip
def test_flatten_and_unflatten_round_trip(value: object) -> None:
    tensors: list[torch.Tensor] = []
    skeleton = flatten({"v": value, "t": torch.arange(3.0)}, tensors)
    back = unflatten(skeleton, tensors)
    assert back["v"] == value and torch.equal(back["t"], torch.arange(3.0)) and len(tensors) == 1


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_a_restore_is_exact_and_training_on_never_changes_the_verified_snapshot() -> None:
    model, opt = _trained()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    keeper = SnapshotKeeper(LiveState(model, opt, [sched]))
    snap = keeper.take(2, "anchored")
    assert keeper.verified is snap and keeper.live_digest() == snap.digest
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()  # the BatchNorm statistics change too
        opt.step()
        sched.step()
    assert keeper.live_digest() != snap.digest
    keeper.take(4, "pending")  # a new copy goes into other buffers: the verified one stays
    assert keeper.verified is snap and snap.intact()
    keeper.restore(snap)
    assert keeper.live_digest() == snap.digest and opt.param_groups[0]["lr"] == 1e-2
    opt.step()  # the optimizer holds clones: the snapshot is untouched
    assert snap.intact() and keeper.live_digest() != snap.digest


def test_a_flipped_bit_in_a_kept_snapshot_is_seen() -> None:
    model, opt = _trained()
    keeper = SnapshotKeeper(LiveState(model, opt))
    snap = keeper.take(2, "pending")
    snap.tensors[0].view(-1).view(torch.int32)[0] ^= 1 << 3
    assert not snap.intact()


def test_recover_needs_an_optimizer_and_refuses_what_it_cannot_re_form() -> None:
    from sdcguard import SDCGuard

    model = torch.nn.Linear(3, 2)
    with pytest.raises(BadInput, match="optimizer="):
        SDCGuard(model, lambda m, b: m(b).sum(), escalate="recover")
    with pytest.raises(BadInput, match="min_replicas"):
        SDCGuard(model, lambda m, b: m(b).sum(), escalate="recover", min_replicas=0)
