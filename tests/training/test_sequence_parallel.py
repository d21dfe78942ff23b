"""SequenceParallel under data parallelism (over gloo, real processes): dp=3 x tp=2, FSDP2 over ``dp``, torchtitan's
block plan (:mod:`tests._sequence_parallel`). A fault in rank 1's ``down`` matmul is a partial sum its reduce-scatter
adds into the other rank's shard of the sequence as well: vetoed on every rank at its step, its TP group named
(``unresolved``), never the innocent partner alone, though a third replica of each shard exists; clean steps commit
and train bit for bit as the unguarded run. Both ``slow`` (six ranks each)."""

from __future__ import annotations

import pytest

from sdcguard.testing import run_ranks
from tests._sequence_parallel import job

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DP, STEPS, AT, FAULTY = 3, 3, 1, 1


@pytest.mark.timeout(300)
def test_a_fault_before_a_reduce_scatter_names_its_tp_group_never_the_partner_alone() -> None:
    results = run_ranks(job, DP * 2, DP, True, {"rank": FAULTY, "step": AT}, STEPS, timeout=280)
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank decided alike"
    steps = seen[0]
    assert steps[0] == (True, []) and not steps[AT][0], steps
    named = [s for _, _, s in steps[AT][1]]
    assert named and all(FAULTY in s for s in named), named
    assert (0,) not in named, f"the innocent partner was named alone: {named}"


@pytest.mark.timeout(300)
def test_clean_sequence_parallel_steps_under_fsdp2_commit_and_train_as_unguarded() -> None:
    guarded = run_ranks(job, DP * 2, DP, True, None, STEPS, timeout=280)
    plain = run_ranks(job, DP * 2, DP, False, None, STEPS, timeout=280)
    assert all(seen == [(True, [])] * STEPS for seen in (r["seen"] for r in guarded)), guarded[0]["seen"]
    assert [r["fingerprints"] for r in guarded] == [r["fingerprints"] for r in plain]
