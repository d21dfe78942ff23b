"""Memory corruption where no replica exists, and non-finite values (over gloo, real processes): one element of a
weight flipped in one rank's memory between two steps is vetoed on every rank at the next step and names that rank
alone (``memory``) on DDP, pure FSDP2 (each element held by one rank only: no replica to outvote it) and FSDP2 x TP;
no incident ever names an innocent rank alone; a NaN in one rank's data is vetoed on every rank and named on that
rank (``nonfinite``). The rules themselves, exhaustively: :mod:`tests.training.verdicts.test_local`.

CI runs pure FSDP2 (the layout with no replica) and the NaN; ``-m slow`` DDP and FSDP2 x TP."""

from __future__ import annotations

import pytest

from sdcguard.testing import run_ranks
from tests._memory import AT, STEPS, job

pytestmark = pytest.mark.distributed


def _alike(results: list[dict]) -> list[dict]:
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank decided alike"
    return seen[0]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("layout", "world"),
    [pytest.param("ddp", 2, marks=pytest.mark.slow), ("fsdp", 2), pytest.param("fsdp_tp", 4, marks=pytest.mark.slow)],
)
def test_a_weight_corrupted_in_one_ranks_memory_is_vetoed_and_names_that_rank_alone(layout: str, world: int) -> None:
    faulty = 1
    steps = _alike(run_ranks(job, world, layout, "memory", faulty, timeout=180))
    assert all(e["commit"] and not e["incidents"] for e in steps[:AT]), steps
    assert all("memory" in e["checks"] for e in steps[1:]), steps
    at = steps[AT]
    assert not at["commit"], at
    assert ("memory", AT, (faulty,)) in at["incidents"], at
    # What the corrupted weights did to the others' computation is explained by it: no incident names another rank.
    assert {s for _, _, s in at["incidents"]} == {(faulty,)}, at
    # The corrupted bits stay in memory: every later step is vetoed too (nothing commits on them).
    assert not any(e["commit"] for e in steps[AT:]), steps
    for e in steps:
        assert all(s == (faulty,) or len(s) > 1 for _, _, s in e["incidents"]), f"an innocent rank alone: {e}"


@pytest.mark.timeout(120)
def test_a_nan_from_one_ranks_data_is_vetoed_everywhere_and_named_on_that_rank() -> None:
    results = run_ranks(job, 2, "ddp", "nan", 1, timeout=100)
    steps = _alike(results)
    assert all(e["commit"] and not e["incidents"] for i, e in enumerate(steps) if i != AT), steps
    assert not steps[AT]["commit"] and ("nonfinite", AT, (1,)) in steps[AT]["incidents"], steps[AT]
    assert [r["finite"] for r in results] == [True, True], "a non-finite value was committed"
    assert len(steps) == STEPS
