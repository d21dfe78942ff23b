"""The guard on pipeline stages (``torch.distributed.pipelining``, ``ScheduleGPipe``, two micro-batches a step; a
``(dp, pp)`` mesh), over gloo: each stage's replicas are compared and replay each other's stage micro-batch, fed
the stage input and output gradient captured at the stage boundary; a fault in one stage is vetoed on every rank of
every stage at its step; with a third replica of the stage the faulty rank is named; a single pipeline (no data
parallelism) reruns each stage on its own device and catches one-off faults; clean runs train bit for bit as the
unguarded ones.

CI runs one cell per setup; ``pytest -m matrix`` the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks
from tests._pipeline import job

pytestmark = pytest.mark.distributed

STEPS, AT = 4, 2
SETUPS = {"pp2": 1, "dp2_pp2": 2, "dp3_pp2": 3}
"""name -> data-parallel replicas of each of the two stages."""
FAULTS = {"dw-sticky": ("dw", 1, None), "dw-once": ("dw", 1, 1), "forward-sticky": ("forward", 0, None),
          "forward-once": ("forward", 0, 1)}  # fmt: skip
"""name -> (kind, the faulty rank's stage... given as a global rank for dp index 0 or 1, times)."""


def _faulty(setup: str, stage: int) -> int:
    """The faulty rank: data-parallel index 1 (0 without replicas) of ``stage``, on a row-major (dp, pp) mesh."""
    dp = SETUPS[setup]
    return (1 if dp > 1 else 0) * 2 + stage


def _run(setup: str, fault: str | None) -> list[dict[str, Any]]:
    dp = SETUPS[setup]
    spec = None
    if fault is not None:
        kind, stage, times = FAULTS[fault]
        spec = {"kind": kind, "rank": _faulty(setup, stage), "step": AT, "times": times}
    return run_ranks(job, dp * 2, dp, True, spec, STEPS, timeout=280)


def _check(setup: str, fault: str, results: list[dict[str, Any]]) -> None:
    dp = SETUPS[setup]
    _, stage, times = FAULTS[fault]
    faulty = _faulty(setup, stage)
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank of every stage decided alike"
    steps = seen[0]
    assert all(e["commit"] and not e["incidents"] for e in steps[:AT]), steps
    if dp == 1 and times is None:  # no replica: a sticky fault reproduces on its own device (checksums see it)
        return
    assert not steps[AT]["commit"], f"the faulty step was committed: {steps[AT]}"
    named = [i for i in steps[AT]["incidents"] if i[1] == AT]
    assert named and all(faulty in s for _, _, s in named), named
    if dp >= 3 or dp == 1:  # a third opinion (or the stage's own rerun of a one-off): the faulty rank alone
        assert {(k, s) for k, _, s in named} == {("replay", (faulty,))}, named


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("setup", "fault"), [("pp2", "forward-once"), ("dp2_pp2", None), ("dp3_pp2", "dw-sticky")])
def test_one_cell_per_setup(setup: str, fault: str | None) -> None:
    if fault is None:
        _clean(setup)
    else:
        _check(setup, fault, _run(setup, fault))


def _clean(setup: str) -> None:
    dp = SETUPS[setup]
    guarded = _run(setup, None)
    plain = run_ranks(job, dp * 2, dp, False, None, STEPS, timeout=280)
    for g, p in zip(guarded, plain, strict=True):
        assert all(e["commit"] and not e["incidents"] and not e["weights"] for e in g["seen"]), g["seen"]
        assert all("replay" in e["checks"] for e in g["seen"])
        assert g["fingerprints"] == p["fingerprints"], "the guarded pipeline trained differently"


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.timeout(600)
@pytest.mark.parametrize("setup", ["pp2", "dp3_pp2"])
def test_clean_stages_commit_and_train_as_unguarded(setup: str) -> None:
    _clean(setup)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_fault_in_one_stage_is_vetoed_by_every_stage(setup: str, fault: str) -> None:
    _check(setup, fault, _run(setup, fault))
