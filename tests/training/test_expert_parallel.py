"""The guard on an expert-parallel job (over gloo, real processes): :class:`sdcguard.testing.moe.MoE` with 4 experts,
top-2 routing and an ``all_to_all_single`` dispatch and combine, on a ``(dp, ep=2)`` mesh. Dense parameters are
compared over every data rank, expert parameters over their expert-data-parallel replicas (the ranks with the same
``ep`` coordinate), and an EP group replays another EP group's micro-batches together, its all-to-alls included.

- clean steps commit with no incident and train bit for bit as the unguarded run (every rank's replay agrees);
- a sticky fault in one rank's expert weight-gradient matmul, or in its forward before the dispatch (crossing the
  all-to-all), is vetoed on every rank at its step and names that rank alone with a third replica of its experts
  (dp=3), and with two (dp=2) names it and its replica, never an innocent rank alone;
- one element of a rank's expert weight flipped in memory names that rank alone (``memory``);
- experts held as plain tensors with no mesh (dense layers alike, experts not) are refused at construction in one
  line; an unseeded model (every parameter differs: DDP's broadcast makes it alike) is not.

CI runs the dp=3 fault cells and the refusal; ``-m slow`` the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks
from tests._moe import EP, job, plain_experts

pytestmark = pytest.mark.distributed

STEPS, AT, FAULTY = 3, 1, 1
"""Steps per run, the faulty step, the faulty global rank ((dp=0, ep=1) on the row-major mesh)."""


def _run(dp: int, fault: str | None) -> list[dict[str, Any]]:
    spec = None if fault is None else {"kind": fault, "rank": FAULTY, "step": AT}
    return run_ranks(job, dp * EP, True, spec, STEPS, timeout=150)


def _alike(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank decided alike"
    steps = seen[0]
    assert all(e["commit"] and not e["incidents"] for e in steps[:AT]), steps
    assert not steps[AT]["commit"], f"the faulty step was committed: {steps[AT]}"
    for e in steps:
        assert all(s == (FAULTY,) or len(s) > 1 for _, _, s in e["incidents"]), f"an innocent rank alone: {e}"
        assert all(FAULTY in s for _, _, s in e["incidents"]), e
    return steps


@pytest.mark.timeout(200)
def test_a_sticky_fault_in_one_ranks_expert_gradient_is_named_alone_with_a_third_replica() -> None:
    steps = _alike(_run(3, "dw"))
    assert steps[AT]["incidents"] == [("replay", AT, (FAULTY,))], steps[AT]
    assert "replay" in steps[AT]["checks"] and "gradient_replica" in steps[AT]["checks"]


@pytest.mark.timeout(200)
def test_a_sticky_fault_before_the_dispatch_is_traced_to_its_rank_past_the_all_to_all() -> None:
    """Rank 1's forward matmuls corrupt what it dispatches: every rank of its EP group computes from it, so the shards
    name both; the traces of the all-to-alls show rank 1's contribution differed first."""
    steps = _alike(_run(3, "forward"))
    assert steps[AT]["incidents"] == [("replay", AT, (FAULTY,))], steps[AT]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_with_two_replicas_a_fault_before_the_dispatch_names_its_rank_and_that_ranks_replica() -> None:
    steps = _alike(_run(2, "forward"))
    assert steps[AT]["incidents"] == [("unresolved", AT, (FAULTY, FAULTY + EP))], steps[AT]
    (unresolved,) = steps[AT]["unresolved"]
    assert "expert-parallel collectives first differed on ranks 1, 3" in unresolved, unresolved


@pytest.mark.timeout(120)
def test_experts_held_as_plain_tensors_without_a_mesh_or_through_guard_step_are_refused_in_one_line() -> None:
    first, second = run_ranks(plain_experts, 2, timeout=100)
    assert first == second, (first, second)
    refused = first["experts"]
    assert "\n" not in refused and "w1" in refused and "'ep'" in refused and "mesh=" in refused, refused
    assert first["all"] == first["none"] == "accepted", first
    step = first["step"]  # guard.step would wrap DTensor experts in DDP: refused, saying what to do instead
    assert "\n" not in step and "DTensor" in step and "begin_step" in step, step


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_clean_expert_parallel_steps_commit_and_train_as_unguarded() -> None:
    guarded = _run(2, None)
    plain = run_ranks(job, 2 * EP, False, None, STEPS, timeout=150)
    for g, p in zip(guarded, plain, strict=True):
        assert all(e["commit"] and not e["incidents"] for e in g["seen"]), g["seen"]
        assert all("replay" in e["checks"] and "gradient_replica" in e["checks"] for e in g["seen"]), g["seen"]
        assert g["fingerprints"] == p["fingerprints"], "the guarded run trained differently"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_with_two_replicas_of_its_experts_the_faulty_rank_is_among_the_suspects() -> None:
    steps = _alike(_run(2, "dw"))
    (unresolved,) = steps[AT]["unresolved"]
    assert steps[AT]["incidents"] == [("unresolved", AT, (FAULTY, FAULTY + EP))], steps[AT]  # it and its replica
    assert "tensor-parallel" not in unresolved, unresolved


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_expert_weight_flipped_in_memory_names_that_rank_alone() -> None:
    steps = _alike(_run(2, "memory"))
    assert ("memory", AT, (FAULTY,)) in steps[AT]["incidents"], steps[AT]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_experts_that_receive_no_token_are_nothing_to_compare_not_a_disagreement() -> None:
    """The router sends every token to EP rank 0's experts: EP rank 1's receive none (zero gradients, an empty
    dispatch), and the step still commits with no incident, as the unguarded run trains."""
    guarded = run_ranks(job, 2 * EP, True, None, STEPS, True, timeout=150)
    plain = run_ranks(job, 2 * EP, False, None, STEPS, True, timeout=150)
    for g, p in zip(guarded, plain, strict=True):
        assert all(e["commit"] and not e["incidents"] for e in g["seen"]), g["seen"]
        assert g["fingerprints"] == p["fingerprints"]
