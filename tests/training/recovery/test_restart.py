"""A restarted job goes on from the verified snapshot that survived in node-local shared memory (``snapshot_dir``),
the state the first run had at that step, bit for bit (a rank restarted on another node receives it from a rank
that kept it); a snapshot corrupted in memory is refused (its bits no longer
have their fingerprints, so no replica can vouch for it in the vote) and the last verified disk checkpoint is used,
and the job says which."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcguard.testing import run_ranks
from tests.training.recovery._restart import corrupt_every_snapshot, first_run, restarted

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_a_restart_resumes_from_the_shared_memory_snapshot_else_from_the_verified_disk_checkpoint(
    tmp_path: Path,
) -> None:
    shm, disk = str(tmp_path / "shm"), str(tmp_path / "ckpt")
    before = run_ranks(first_run, 2, shm, disk, 6, timeout=100)
    step = before[0]["step"]
    assert step is not None and step >= 3  # the newest verified state (replay every 2 steps), not the disk's
    again = run_ranks(restarted, 2, shm, disk, timeout=100)
    for r in again:
        assert (r["source"], r["step"], r["resume_from"]) == ("snapshot", step, step), r["detail"]
        assert r["live"] == before[0]["digests"][step]  # the state the first run had at that step, bit for bit
    moved = run_ranks(restarted, 2, shm, disk, str(tmp_path / "other-node"), timeout=100)
    for r in moved:  # rank 1 on a node without the snapshot receives it from rank 0, checked by the vote
        assert (r["source"], r["step"], r["live"]) == ("snapshot", step, before[0]["digests"][step]), r["detail"]
    assert corrupt_every_snapshot(shm) == 2
    fell_back = run_ranks(restarted, 2, shm, disk, timeout=100)
    for r in fell_back:
        assert (r["source"], r["step"]) == ("checkpoint", 3)
        assert "corrupted in memory" in r["detail"]
        assert r["live"] == before[0]["digests"][3]
