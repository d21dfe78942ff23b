"""The exit-code contract and a restart under torchrun, through ``sdcguard launch`` (as a user or the Slurm script
runs it): a leaver exits 0 under torchrun so its agent does not stop the others, the job goes on without it, and
the wrapper still reports 86 for the node; a restarted job goes on from the snapshot that survived in shared memory.

torchrun's own restart (``--max-restarts 1``) cannot be used for the second part on this torch: a gloo job restarted
in place fails in ``Gloo connectFullMesh failed ... Connection refused`` even without the guard (and hangs with
``--standalone``), so the job is restarted by a second torchrun, as a launcher or scheduler restarts a job
(``deploy/slurm/sdcguard-train.sh``). docs/recovery.md says so.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = Path(__file__).with_name("torchrun_job.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(tmp: Path, ranks: int, *args: int) -> subprocess.CompletedProcess[str]:
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
    ]
    job = [str(JOB), str(tmp / "out"), str(tmp / "shm"), *map(str, args)]
    return subprocess.run(
        [sys.executable, "-m", "sdcguard", "launch", "--", *torchrun, *job], capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip


def _notes(tmp: Path, rank: int) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp / "out" / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_a_leaver_under_torchrun_leaves_alone_and_a_restarted_job_resumes_from_shared_memory(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    # Three ranks, min_replicas=2: rank 1 is sticky from step 4 and leaves; ranks 0 and 2 go on, until the process
    # of data rank 0 is lost at step 8 (as a lost node ends it) and torchrun stops the job.
    first = _launch(tmp_path, 3, 2, 1, 8)
    assert first.returncode == 86, first.stderr[-3000:]
    assert "this rank left the job; the others went on" in first.stderr.splitlines()[-1]
    assert "ChildFailedError" not in first.stderr  # torchrun's traceback of the exit is held back
    assert _notes(tmp_path, 1) == [{"attempt": 0, "restored": "none", "from": None, "ended": "started"}]
    [_, lost] = _notes(tmp_path, 0)
    assert lost["ended"] == "lost" and lost["step"] == 8 and lost["resumes"] == [[4, 3]]  # went on past rank 1
    # The job restarted by a second torchrun without the suspect device, two ranks on a new rank map: both go on
    # from the newest verified snapshot in shared memory (the two-replica run's), not from the start.
    second = _launch(tmp_path, 2, -1, -1, -1)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "restart: the verified snapshot in host memory, step 7" in second.stderr
    for rank in (0, 1):
        last = _notes(tmp_path, rank)[-1]
        assert (last["restored"], last["from"], last["ended"]) == ("snapshot", 7, "finished")
    assert not list((tmp_path / "shm").glob("rank[01].*"))  # a job that ended well frees the node's memory
