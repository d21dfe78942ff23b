"""``escalate="recover"`` in a real HSDP job (FSDP2 over a replicas x 2 shards mesh, gloo processes): a sticky fault
on one rank of replica 1; that rank exits 86 and its healthy shard-peer leaves with it (85: a replica missing a shard
cannot go on); the others go on with one replica fewer (3 x 2 -> 2 x 2 with ``min_replicas=2``, 2 x 2 -> 1 x 2 with
``min_replicas=1``) on a new mesh, and each one's local shards of the weights and of the AdamW state equal, bit for
bit, a fault-free job whose replica 1 left before the same step and whose other ranks went on as a fresh HSDP job
resumed from their state (public torch APIs only: a new module, ``fully_shard`` over a new mesh, a new optimizer);
without ``min_replicas`` every rank leaves by the contract. No spares: dedicated shadows are DDP-only. A restarted
job resumes each shard from shared memory. Layouts still not re-formed (tensor parallel meshes, FSDP2 without
replicas) are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcguard.testing import run_ranks
from tests.training.recovery._hsdp_jobs import (
    first_hsdp_run,
    recovered_and_reference,
    recovering,
    refusals,
    restarted_hsdp,
)

pytestmark = [pytest.mark.distributed]

RESUME = 3
"""The state the recovery goes back to: a fault from step 3 is seen at the sample of step 4 (``replay_every=2``), and
the last verified snapshot is the state step 3 starts from (as in the DDP test's cell)."""


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("names", "shape"),
    [
        (("replicate", "shard"), (3, 2)),
        (("dp_replicate", "dp_shard"), (3, 2)),  # torchtitan's names
        (("replicate", "shard"), (2, 2)),  # min_replicas=1: one replica goes on
    ],
)
def test_hsdp_replica_with_a_sticky_rank_leaves_whole_and_the_survivors_equal_a_fault_free_run_of_one_replica_fewer(
    names: tuple[str, str], shape: tuple[int, int]
) -> None:
    world = shape[0] * shape[1]
    results = run_ranks(recovered_and_reference, world, RESUME, names, shape, timeout=180)
    recovered = [r["recovered"] for r in results]
    assert recovered[2] == {"exit": 86}  # the named rank
    assert recovered[3] == {"exit": 85}  # its shard-peer: released, not a suspect
    survivors = [r for r in range(world) if r not in (2, 3)]
    assert [recovered[r]["data_rank"] for r in survivors] == list(range(len(survivors)))  # numbered by place
    for r in survivors:
        assert recovered[r]["resumes"] == [(4, RESUME)], recovered[r]["resumes"]
        assert recovered[r]["recovered"] == [("replay", (2,), RESUME)], recovered[r]["recovered"]
        reference = results[r]["reference"]
        assert reference["data_rank"] == recovered[r]["data_rank"]
        assert recovered[r]["weights"] == reference["weights"], r
        assert recovered[r]["optimizer"] == reference["optimizer"], r
    assert recovered[0]["weights"] != recovered[1]["weights"]  # two shards
    if world == 6:
        assert recovered[0]["weights"] == recovered[4]["weights"]  # replicas of shard 0


@pytest.mark.timeout(120)
def test_without_min_replicas_a_job_that_would_lose_a_replica_leaves_by_the_contract() -> None:
    said = run_ranks(recovering, 4, (2, 3), None, ("replicate", "shard"), (2, 2), timeout=100)
    assert said == [{"exit": 85}, {"exit": 85}, {"exit": 86}, {"exit": 85}]


@pytest.mark.timeout(120)
def test_recover_refuses_tensor_parallel_meshes_and_fsdp2_without_replicas_in_one_line() -> None:
    said = run_ranks(refusals, 2, timeout=100)
    assert said[0] == said[1]
    tp, fsdp = said[0]
    assert "model-parallel or pipeline dimensions are not supported yet" in tp and "\n" not in tp
    assert "cannot be re-formed (its mesh is FSDPMeshInfo, not HSDP" in fsdp and "\n" not in fsdp


@pytest.mark.timeout(200)
def test_a_restarted_hsdp_job_resumes_each_shard_from_the_shared_memory_snapshot(tmp_path: Path) -> None:
    """Each rank's snapshot is its own shard: a restart votes per mesh column, and a rank restarted on an empty node
    receives its shard from the rank holding the same shard in the other replica."""
    shm = str(tmp_path / "shm")
    before = run_ranks(first_hsdp_run, 4, shm, 6, timeout=150)
    step = before[0]["step"]
    assert step is not None and step >= 3 and all(b["step"] == step for b in before)
    for moved in (None, str(tmp_path / "other-node")):
        again = run_ranks(restarted_hsdp, 4, shm, moved, timeout=150)
        for rank, r in enumerate(again):
            assert (r["source"], r["step"]) == ("snapshot", step), r
            assert r["state"] == before[rank]["states"][step], rank  # bit for bit, each rank's own shard
