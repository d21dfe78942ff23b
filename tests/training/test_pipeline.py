"""The guard on pipeline stages (``torch.distributed.pipelining``, ``ScheduleGPipe``, two micro-batches a step; a
``(dp, pp)`` mesh), over gloo: each stage's replicas are compared and replay each other's stage micro-batch, fed
the stage input and output gradient captured at the stage boundary; a fault in one stage is vetoed on every rank of
every stage at its step; with a third replica of the stage the faulty rank is named; a single pipeline (no data
parallelism) reruns each stage on its own device and catches one-off faults, and its matmul checksums catch a sticky
one (without them it commits: tested too); a sticky fault stays on for every replay and rerun; a stage weight flipped
in one rank's memory is named alone in every incident; clean runs train bit for bit as the unguarded ones.

CI runs one cell per setup; ``pytest -m matrix`` the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks
from tests._pipeline import four_calls, job

pytestmark = pytest.mark.distributed

STEPS, AT = 4, 2
SETUPS = {"pp2": 1, "dp2_pp2": 2, "dp3_pp2": 3}
"""name -> data-parallel replicas of each of the two stages."""
FAULTS = {
    "dw-sticky": ("dw", 1, None),
    "dw-once": ("dw", 1, 1),
    "forward-sticky": ("forward", 0, None),
    "forward-once": ("forward", 0, 1),
    "memory": ("memory", 1, None),
}
"""name -> (kind, the faulty rank's stage, times: None for sticky, every call of the step, replays and reruns too)."""
SCHEDULES = ("gpipe", "1f1b")


def _faulty(setup: str, stage: int) -> int:
    """The faulty rank: data-parallel index 1 (0 without replicas) of ``stage``, on a row-major (dp, pp) mesh."""
    dp = SETUPS[setup]
    return (1 if dp > 1 else 0) * 2 + stage


def _checksums(setup: str, fault: str | None) -> int:
    """A single pipeline has no replica to replay a sticky fault on another device: its matmul checksums catch it
    (on every step here); elsewhere they stay off, so replay alone is tested."""
    sticky = fault is not None and FAULTS[fault][2] is None
    return 1 if SETUPS[setup] == 1 and sticky else 0


def _run(setup: str, fault: str | None, schedule: str = "gpipe", checksum_every: int = 0) -> list[dict[str, Any]]:
    dp = SETUPS[setup]
    spec = None
    if fault is not None:
        kind, stage, times = FAULTS[fault]
        spec = {"kind": kind, "rank": _faulty(setup, stage), "step": AT, "times": times}
    return run_ranks(job, dp * 2, dp, True, spec, STEPS, schedule, checksum_every, timeout=280)


def _check(setup: str, fault: str, results: list[dict[str, Any]]) -> None:
    dp = SETUPS[setup]
    _, stage, times = FAULTS[fault]
    faulty = _faulty(setup, stage)
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank of every stage decided alike"
    steps = seen[0]
    assert all(e["commit"] and not e["incidents"] for e in steps[:AT]), steps
    assert not steps[AT]["commit"], f"the faulty step was committed: {steps[AT]}"
    named = [i for i in steps[AT]["incidents"] if i[1] == AT]
    assert named and all(faulty in s for _, _, s in named), named
    if fault == "memory":  # its own shard changed: named alone with no vote, and what it caused is explained by it
        assert ("memory", (faulty,)) in {(k, s) for k, _, s in named} and {s for _, _, s in named} == {(faulty,)}, named
    elif dp == 1 and times is None:  # no replica, a sticky fault: the stage's own checksums name it alone
        assert {(k, s) for k, _, s in named} == {("checksum", (faulty,))}, named
    elif dp >= 3 or dp == 1:  # a third opinion (or the stage's own rerun of a one-off): the faulty rank alone
        assert {(k, s) for k, _, s in named} == {("replay", (faulty,))}, named
    else:  # two replicas of the stage: the faulty rank among the suspects, never an innocent one alone
        assert all(s == (faulty,) or len(s) > 1 for _, _, s in named), named


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("setup", "fault", "schedule"),
    [("pp2", "dw-sticky", "gpipe"), ("dp2_pp2", None, "1f1b"), ("dp3_pp2", "forward-sticky", "1f1b")],
)
def test_one_cell_per_setup(setup: str, fault: str | None, schedule: str) -> None:
    if fault is None:
        _clean(setup, schedule)
    else:
        _check(setup, fault, _run(setup, fault, schedule, _checksums(setup, fault)))


def _clean(setup: str, schedule: str = "gpipe") -> None:
    dp = SETUPS[setup]
    guarded = _run(setup, None, schedule)
    plain = run_ranks(job, dp * 2, dp, False, None, STEPS, schedule, timeout=280)
    for g, p in zip(guarded, plain, strict=True):
        assert all(e["commit"] and not e["incidents"] and not e["weights"] for e in g["seen"]), g["seen"]
        assert all("replay" in e["checks"] for e in g["seen"])
        assert g["fingerprints"] == p["fingerprints"], "the guarded pipeline trained differently"


def test_a_single_pipeline_without_checksums_commits_a_sticky_fault_it_cannot_see() -> None:
    """What the docs say a single pipeline needs the checksums for: its rerun of a stage on the same device
    reproduces a sticky fault, so without them the step commits (with them: the cell above, vetoed and named)."""
    seen = _run("pp2", "dw-sticky", "gpipe", checksum_every=0)[0]["seen"]
    assert seen[AT]["commit"] and not seen[AT]["incidents"], seen[AT]


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("setup", ["pp2", "dp3_pp2"])
def test_clean_stages_commit_and_train_as_unguarded(setup: str, schedule: str) -> None:
    _clean(setup, schedule)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_fault_in_one_stage_is_vetoed_by_every_stage(setup: str, fault: str, schedule: str) -> None:
    _check(setup, fault, _run(setup, fault, schedule, _checksums(setup, fault)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("by", [pytest.param("mesh", marks=pytest.mark.slow), "group"])
def test_a_stage_guard_nothing_watches_refuses_its_first_step_in_one_line(by: str) -> None:
    """The four calls around a schedule without ``watch_stage`` crashed inside the replay (the pipeline's batch fed
    to a later stage: ``mat1 and mat2 shapes cannot be multiplied``); now every rank refuses the first step, saying
    what to call. With ``watch_stage`` the same loop runs clean with a group per stage (1F1B)."""
    refused = run_ranks(four_calls, 4, by, False, timeout=100)
    assert all(r == refused[0] and isinstance(r, str) for r in refused), refused
    assert "\n" not in refused[0] and "watch_stage(guard, stage)" in refused[0], refused[0]
    if by == "group":  # on a mesh, the cells above run watched stages
        watched = run_ranks(four_calls, 4, by, True, timeout=100)
        assert all(seen == [(True, [])] * 2 for seen in watched), watched
