"""``escalate="recover"`` in real jobs (gloo processes), each compared bit for bit with a fault-free run of the same
steps: a sticky fault on worker 1; with a dedicated shadow as a hot spare the run finishes on three workers, worker
1 exits 86, and every survivor's weights and optimizer state equal a fault-free three-worker run's; without a spare
and ``min_replicas=2`` the run finishes on two replicas, equal to a fault-free run that went on with two replicas
from the same verified state; without either every rank exits by the contract (86 the suspect, 85 the others)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from sdcguard.records import Incident
from sdcguard.testing import run_ranks
from tests.training.recovery._jobs import fault_free, recovering

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    return a["weights"] == b["weights"] and a["optimizer"] == b["optimizer"]


@pytest.fixture(scope="module")
def three_workers() -> list[dict[str, object]]:
    """A fault-free three-worker run (plain DDP), the reference of every run with a spare."""
    return run_ranks(fault_free, 3, None, timeout=100)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("start", [3], ids=["the-step-before-its-sample"])
def test_a_spare_takes_the_faulty_workers_place_and_the_run_equals_a_fault_free_one(
    start: int, three_workers: list[dict[str, object]]
) -> None:
    # replay_every=1 with one shadow: the samples rotate over the workers, worker 1's at steps 1, 4, 7. The fault
    # from its sampled step (4) is the attribution matrix's recover cell that CI runs (test_attribution_matrix.py).
    results = run_ranks(recovering, 4, 1, (1, start), None, timeout=120)  # 3 workers + 1 shadow (rank 3)
    assert results[1] == {"exit": 86}
    survivors = [r for i, r in enumerate(results) if i != 1]
    assert sorted(r["data_rank"] for r in survivors) == [0, 1, 2]  # the spare feeds a data rank
    for r in survivors:
        assert _same(r, three_workers[r["data_rank"]]), r["data_rank"]
    told = results[0]["recovered"]
    assert told and told[0][1] == (1,) and told[0][4] is not None  # the replacement device
    assert told[0][2] <= start and told[0][3] >= 1  # rolled back to a state from before the fault
    assert results[0]["resumes"] == results[2]["resumes"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "start",
    # the step before a sample runs with -m matrix (the spare's test above starts there in every run)
    [pytest.param(3, marks=pytest.mark.matrix), 4],
    ids=["the-step-before-a-sample", "a-sampled-step"],
)
def test_without_a_spare_the_survivors_go_on_as_a_smaller_job(start: int) -> None:
    results = run_ranks(recovering, 3, 0, (1, start), 2, timeout=120)
    assert results[1] == {"exit": 86}
    [(at, resume)] = results[0]["resumes"]
    assert at == 4 and resume == 3  # seen at the sample of step 4; the last verified state is the one step 3 starts
    reference = run_ranks(fault_free, 3, resume, timeout=100)
    for r in (results[0], results[2]):
        assert _same(r, reference[[0, 2][r["data_rank"]]])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_weight_flipped_in_one_ranks_memory_sends_that_rank_away_and_the_survivors_equal_a_fault_free_run() -> None:
    """The memory check names the rank alone (sticky: it escalates); it leaves with 86 and the other two roll back to
    the last verified state and go on, bit for bit a fault-free run in which it left there."""
    job = functools.partial(recovering, memory=True)
    results = run_ranks(job, 3, 0, (1, 4), 2, timeout=120)
    assert results[1] == {"exit": 86}, results[1]
    [(at, resume)] = results[0]["resumes"]
    assert at == 4 and resume <= 4, results[0]["resumes"]
    assert results[0]["recovered"][0][:2] == ("memory", (1,)), results[0]["recovered"]
    reference = run_ranks(fault_free, 3, resume, timeout=100)
    for r in (results[0], results[2]):
        assert _same(r, reference[[0, 2][r["data_rank"]]])


@pytest.mark.timeout(200)
def test_an_exit_names_every_step_the_fault_may_have_touched_and_the_state_to_roll_back_to(tmp_path: Path) -> None:
    # The drill: a sticky fault from step 3 (not sampled) seen at the sample of step 4, escalate="exit".
    # (escalate="recover" without a spare or min_replicas exits the same way: tests/training/recovery/test_torchrun.py)
    job = functools.partial(recovering, escalate="exit", verdicts=str(tmp_path))
    results = run_ranks(job, 3, 0, (1, 3), None, timeout=120)
    assert [r["exit"] for r in results] == [85, 86, 85]
    verdict = json.loads((tmp_path / "rank1.jsonl").read_text().splitlines()[0])
    assert verdict["status"] == 86
    [incident] = [Incident(**{**i, "suspect_ranks": tuple(i["suspect_ranks"])}) for i in verdict["incidents"]]
    assert (incident.step, incident.first_step, incident.rollback_step) == (4, 3, 3)
    assert incident.steps() == "3-4" and incident.roll_back_to() == "state before step 3"
