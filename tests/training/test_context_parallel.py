"""The guard on a context-parallel job (over gloo, real processes), with the sequence split written in the test
(torch 2.13's ``context_parallel`` raises ``NotImplementedError`` on CPU): :mod:`tests._context_parallel`, a causal
attention block whose ``cp`` ranks each hold a contiguous part of the sequence and all-gather its keys and values.

- ranks along ``cp`` hold the same dense weights, so the weight check compares over ``dp x cp``: with dp=2 x cp=2 a
  weight flipped in one rank's memory is outvoted by three copies and named alone (``weight_replica``), beside its
  own ``memory`` incident, where dp=2 alone would have no third opinion;
- a fault in one rank's forward crosses the CP all-gather: vetoed on every rank at its step, traced to the rank whose
  contribution to the all-gather differed first: with dp=3 x cp=2 that rank alone, with dp=2 x cp=2 it and its
  replica (``unresolved``, worded "context-parallel", not "tensor-parallel"), never an innocent rank alone;
- clean steps commit and train bit for bit as the unguarded run (dp=2 x cp=2 and dp=1 x cp=3); with dp=1 x cp=3 a
  sticky forward fault has no replica to replay it and the matmul checksums name its rank alone.

CI runs the first two in one run and the dp=3 x cp=2 fault; ``-m slow`` the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks
from tests._context_parallel import job

pytestmark = pytest.mark.distributed

STEPS = 4


def _alike(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank decided alike"
    return seen[0]


@pytest.mark.timeout(200)
def test_cp_ranks_witness_each_others_weights_and_a_crossing_fault_is_worded_context_parallel() -> None:
    faults = [{"kind": "forward", "rank": 1, "step": 1}, {"kind": "memory", "rank": 2, "step": 2}]
    steps = _alike(run_ranks(job, 4, 2, True, faults, STEPS, timeout=180))
    assert steps[0]["commit"] and not steps[0]["incidents"], steps[0]
    crossed = steps[1]
    assert not crossed["commit"] and crossed["incidents"] and crossed["unresolved"], crossed
    assert all(1 in s for _, _, s in crossed["incidents"]), crossed
    assert ("unresolved", 1, (1, 3)) in crossed["incidents"], crossed  # rank 1 and its replica, not every rank
    assert all("context-parallel" in w and "tensor-parallel" not in w for w in crossed["unresolved"]), crossed
    memory = steps[2]
    assert not memory["commit"], memory
    assert {("memory", 2, (2,)), ("weight_replica", 2, (2,))} <= set(memory["incidents"]), memory
    for e in steps:
        assert all(len(s) > 1 or s in ((1,), (2,)) for _, _, s in e["incidents"]), f"an innocent rank alone: {e}"


@pytest.mark.timeout(200)
def test_with_a_third_replica_a_fault_crossing_the_cp_all_gather_is_traced_to_its_rank() -> None:
    steps = _alike(run_ranks(job, 6, 3, True, [{"kind": "forward", "rank": 1, "step": 1}], 3, timeout=180))
    assert steps[0]["commit"] and steps[2]["commit"], steps
    assert not steps[1]["commit"] and steps[1]["incidents"] == [("replay", 1, (1,))], steps[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("dp", "world"), [(2, 4), (1, 3)])
def test_clean_context_parallel_steps_commit_and_train_as_unguarded(dp: int, world: int) -> None:
    guarded = run_ranks(job, world, dp, True, [], STEPS, timeout=150)
    plain = run_ranks(job, world, dp, False, [], STEPS, timeout=150)
    for g, p in zip(guarded, plain, strict=True):
        assert all(e["commit"] and not e["incidents"] for e in g["seen"]), g["seen"]
        assert all("replay" in e["checks"] and "gradient_replica" in e["checks"] for e in g["seen"]), g["seen"]
        assert g["fingerprints"] == p["fingerprints"], "the guarded run trained differently"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_without_replicas_the_checksums_name_the_rank_of_a_sticky_forward_fault() -> None:
    faults = [{"kind": "forward", "rank": 1, "step": 1}]
    steps = _alike(run_ranks(job, 3, 1, True, faults, 3, 1, timeout=180))
    assert not steps[1]["commit"], steps[1]
    assert ("checksum", 1, (1,)) in steps[1]["incidents"], steps[1]
    assert all(s == (1,) or len(s) > 1 for _, _, s in steps[1]["incidents"]), steps[1]
