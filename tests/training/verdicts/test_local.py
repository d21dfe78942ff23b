"""What a rank shows of itself, with no vote (:mod:`sdcguard.training.verdicts.local`, no processes): a rank whose
own shards changed outside the optimizer step is named alone, and only such a rank; a non-finite loss or gradient is
always reported and never names a rank that saw none; and the memory check sees every single-bit change of a shard
between the optimizer step and the next step's check."""

from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sdcguard.records import Incident
from sdcguard.training.local.finite import NonFiniteCheck
from sdcguard.training.local.memory import MemoryCheck
from sdcguard.training.step_check import StepState
from sdcguard.training.verdicts.local import EXPLAINABLE, explained, memory_incidents, nonfinite_incidents

NAMES = ["a.weight", "a.bias", "b.weight"]


def _ids(n: int) -> list[tuple[int, str | None, str]]:
    return [(10 + i, f"sim:{i}", "host") for i in range(n)]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=8))
def test_memory_names_exactly_the_ranks_whose_shards_changed_each_alone(rows: list[tuple[int, int]]) -> None:
    found = memory_incidents(5, rows, NAMES, _ids(len(rows)), "job")
    changed = [10 + i for i, (n, _) in enumerate(rows) if n > 0]
    assert [i.suspect_ranks for i in found] == [(r,) for r in changed]
    assert all(i.kind == "memory" and i.sticky and i.step == 5 and i.parameter in NAMES for i in found)


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=8))
@example([(0, 0), (0, 1), (0, 0)])  # FSDP2: one rank's shard came out of the reduce-scatter with an infinity
def test_a_nonfinite_value_is_always_reported_and_names_a_rank_alone_only_for_its_own_loss(
    rows: list[tuple[int, int]],
) -> None:
    found = nonfinite_incidents(5, rows, _ids(len(rows)), None)
    flagged = {10 + i for i, (loss, grad) in enumerate(rows) if loss or grad}
    assert bool(found) == bool(flagged)
    losses = {10 + i for i, (loss, _) in enumerate(rows) if loss}
    for inc in found:
        assert inc.kind == "nonfinite"
        if losses and len(losses) < len(rows):  # the ranks whose own loss was not finite: the first to produce it
            assert set(inc.suspect_ranks) == losses
        else:  # a gradient after the reduction: every rank that reduced it, none alone
            assert inc.suspect_ranks == tuple(10 + i for i in range(len(rows)))


@settings(max_examples=60, deadline=None)
@given(tensor=st.integers(0, 2), element=st.integers(0, 10_000), bit=st.integers(0, 31))
def test_the_memory_check_sees_any_one_bit_changed_in_any_shard(tensor: int, element: int, bit: int) -> None:
    torch.manual_seed(0)
    shards = [torch.randn(4, 6), torch.randn(6), torch.randn(3, 5)]
    check = MemoryCheck(lambda: shards, NAMES, _ids(1), None, torch.device("cpu"), index=0)
    state = StepState(step=1, sample=0, sampled=False, observed=None)
    assert check.columns(state).tolist() == [0, 0, 0]  # no reference before the first optimizer step
    check.settle()
    assert check.columns(state).tolist() == [1, 0, 0]
    flat = shards[tensor].view(-1).view(torch.int32)
    flat[element % flat.numel()] ^= 1 << bit if bit < 31 else -(1 << 31)
    row = check.columns(state).tolist()
    assert row == [1, 1, tensor]
    result = check.conclude(state, [row])
    assert result.veto and [i.suspect_ranks for i in result.incidents] == [(10,)]
    check.settle()  # the corrupted bits never become the reference while they stand
    assert check.columns(state).tolist() == [1, 1, tensor]
    check.forget()
    assert check.columns(state).tolist() == [0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(
    tensor=st.integers(0, 2),
    element=st.integers(0, 10_000),
    value=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_the_nonfinite_check_sees_one_nonfinite_gradient_element_and_nothing_in_finite_ones(
    tensor: int, element: int, value: float, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    grads: list[torch.Tensor | None] = [(torch.randn(40, 60) * 6e4).clamp(-6e4, 6e4).to(dtype) for _ in range(3)]
    grads.append(None)  # a parameter without gradient
    check = NonFiniteCheck(lambda: grads, _ids(1), None, torch.device("cpu"))
    state = StepState(step=1, sample=0, sampled=False, observed=None)
    assert check.columns(state).tolist() == [0, 0]  # large finite fp16 values never sum to an infinity here
    g = grads[tensor]
    assert g is not None
    g.view(-1)[element % g.numel()] = value
    assert check.columns(state).tolist() == [0, 1]
    assert check.conclude(state, [[0, 1]]).veto


_KINDS = sorted(EXPLAINABLE | {"memory", "replay", "checksum"})
_incident = st.builds(
    lambda kind, ranks: Incident(
        kind=kind,
        step=3,
        suspect_ranks=tuple(sorted(ranks)),
        device=None,
        detail="d",
        devices=tuple(f"sim:{r}" for r in sorted(ranks)),
        hosts=tuple("h" for _ in ranks),
    ),
    st.sampled_from(_KINDS),
    st.sets(st.integers(0, 7), min_size=1, max_size=8),
)


@given(st.lists(_incident, max_size=6), st.sets(st.integers(0, 7), max_size=3))
def test_a_ranks_memory_corruption_narrows_what_it_explains_and_nothing_else(
    incidents: list[Incident], corrupted: set[int]
) -> None:
    out = explained(incidents, corrupted)
    bad = corrupted | {r for i in incidents if i.kind == "memory" for r in i.suspect_ranks}
    # a nonfinite incident is also explained by a rank a replay or checksum verdict names alone (none corrupted)
    alone = {i.suspect_ranks[0] for i in incidents if i.kind in ("replay", "checksum") and len(i.suspect_ranks) == 1}
    assert [i.kind for i in out] == [i.kind for i in incidents]
    for before, after in zip(incidents, out, strict=True):
        explaining = bad | alone if before.kind == "nonfinite" and not bad else bad
        hit = tuple(r for r in before.suspect_ranks if r in explaining)
        if before.kind in EXPLAINABLE and hit:
            assert after.suspect_ranks == hit and after.devices == tuple(f"sim:{r}" for r in hit)
        else:
            assert after == before  # never widened, never touched without a corrupted rank among its suspects
        assert set(after.suspect_ranks) <= set(before.suspect_ranks) and after.suspect_ranks


def test_a_step_with_no_optimizer_step_settled_since_the_last_check_is_not_checked() -> None:
    """A loop calling ``after_optimizer_step`` only now and then: the reference would predate the optimizer's writes,
    so such a step is not checked, never a false alarm on every rank."""
    shards = [torch.ones(4)]
    check = MemoryCheck(lambda: shards, ["w"], _ids(1), None, torch.device("cpu"), index=0)
    state = StepState(step=1, sample=0, sampled=False, observed=None)
    check.settle()
    assert check.conclude(state, [check.columns(state).tolist()]).ran == "memory"
    shards[0] += 1  # the optimizer's write, with no after_optimizer_step after it
    row = check.columns(state).tolist()
    assert row == [0, 0, 0] and not check.conclude(state, [row]).incidents


def test_a_nonfinite_value_a_replay_traced_to_one_rank_names_that_rank_alone() -> None:
    """A backward fault that made an infinity on rank 1: the reduction spread it to every rank (nonfinite names all
    three), rank 1's replay showed its computation wrong: the nonfinite incident is narrowed to rank 1."""

    def incident(kind: str, ranks: tuple[int, ...]) -> Incident:
        devices = tuple(f"sim:{r}" for r in ranks)
        hosts = tuple("h" for _ in ranks)
        return Incident(kind=kind, step=3, suspect_ranks=ranks, device=None, detail="d", devices=devices, hosts=hosts)

    out = explained([incident("replay", (1,)), incident("nonfinite", (0, 1, 2))])
    assert [i.suspect_ranks for i in out] == [(1,), (1,)] and out[1].devices == ("sim:1",)
    assert "replay or checksums showed wrong" in out[1].detail
    # FSDP2 (the full campaign's seeds 7033 and 7034): rank 0's backward made the infinity, and the reduce-scatter
    # put it in rank 1's shard only; the nonfinite incident names every rank, and rank 0's replay narrows it to rank 0
    spread = nonfinite_incidents(3, [(0, 0), (0, 1), (0, 0)], [(r, f"sim:{r}", "h") for r in range(3)], None)
    assert [i.suspect_ranks for i in spread] == [(0, 1, 2)]
    out = explained([incident("replay", (0,)), *spread])
    assert [i.suspect_ranks for i in out] == [(0,), (0,)] and out[1].devices == ("sim:0",)
    kept = explained([incident("replay", (0, 1)), incident("nonfinite", (0, 1, 2))])  # no rank named alone
    assert [i.suspect_ranks for i in kept] == [(0, 1), (0, 1, 2)]
