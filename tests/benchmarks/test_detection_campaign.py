"""The detection campaign (``benchmarks/detection.py``): its Megatron-LM baseline follows Megatron's rules, its
derivation from per-step measurements to "detected within N steps" matches a step-by-step simulation of the
schedule, and the quick campaign (a few faults per target, every job: DDP with the baselines, a dedicated shadow,
FSDP2, Lightning) still shows the headline of docs/detection.md on the current code.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.campaign.baselines import MegatronChecks
from benchmarks.campaign.schedule import Component, curves, quantile_steps, within


def test_megatron_checks_follow_megatron() -> None:
    m = MegatronChecks(num_samples=3)
    assert m.check(1e9, [float("nan")]) == []  # validate_result skips the first iteration entirely
    assert [m.check(v, [1.0]) for v in (2.0, -4.0, 3.0)] == [[], [], []]  # learning max |loss| (4) and |norm| (1)
    assert m.check(39.9, [9.9]) == [] and m.check(-40.0, [1.0]) == ["spiky_loss"]
    assert m.check(1.0, [10.0]) == ["large_grad"]  # the same 10x rule on each bucket's local gradient norm
    assert m.check(float("nan"), [1.0]) == ["nan_loss"]  # NaN is never "spiky": checked on its own
    assert m.check(1.0, [1.0, float("inf")]) == ["inf_grad"]
    assert m.check(float("inf"), [float("nan")]) == ["inf_loss", "nan_grad"]


def _simulate(comps: tuple[Component, ...], timing: str, horizon: int) -> list[float]:
    """An independent, step-by-step reading of the schedule: exact, by enumerating every phase and, for an
    intermittent fault (one check), every pattern of later hits (``hits[k]``: the step reported at offset ``k``
    was hit)."""
    L = math.lcm(*(c.period for c in comps))
    later = max((c.later for c in comps), default=0.0)
    patterns = list(itertools.product((0, 1), repeat=horizon)) if timing == "intermittent" else [(0,) * horizon]
    missed = [0.0] * (horizon + 1)
    for phase in range(L):
        for hits in patterns:
            weight = math.prod(later if h else 1 - later for h in hits) if timing == "intermittent" else 1.0
            first = None
            for k in range(horizon):
                for c in comps:
                    j = k - c.delay
                    if j < 0 or (phase + j) % c.period:
                        continue
                    deterministic = c.state or (c.hit and c.persistent) or (timing == "sticky" and c.hit)
                    if (c.hit if j == 0 else deterministic or hits[k]) and first is None:
                        first = k
            for n in range(horizon + 1):
                if first is None or first >= n:
                    missed[n] += weight / L
    return missed


component = st.builds(
    Component,
    period=st.sampled_from([1, 2, 3, 4, 6]),
    delay=st.integers(0, 2),
    hit=st.booleans(),
    state=st.booleans(),
    persistent=st.booleans(),
)


@given(st.lists(component, min_size=1, max_size=3), st.sampled_from(["one-off", "sticky"]))
def test_the_derivation_matches_a_step_by_step_simulation(comps: list[Component], timing: str) -> None:
    missed, _ = curves(tuple(comps), timing, 12)
    assert [round(x, 9) for x in missed] == [round(x, 9) for x in _simulate(tuple(comps), timing, 12)]


@given(st.sampled_from([1, 2, 3]), st.integers(0, 1), st.booleans(), st.floats(0.05, 0.95))
def test_intermittent_later_hits_match_an_exact_enumeration(period: int, delay: int, hit: bool, q: float) -> None:
    comps = (Component(period=period, delay=delay, hit=hit, later=q),)
    missed, _ = curves(comps, "intermittent", 7)
    assert missed == pytest.approx(_simulate(comps, "intermittent", 7), abs=1e-9)


def test_sampling_schedules_give_the_documented_figures() -> None:
    one_off, _ = curves((Component(period=50, hit=True),), "one-off", 1000)
    assert within(one_off, 1) == pytest.approx(1 / 50) and within(one_off, 1000) == pytest.approx(1 / 50)
    sticky, attributed = curves((Component(period=50, hit=True),), "sticky", 1000)
    assert within(sticky, 10) == pytest.approx(10 / 50) and within(sticky, 50) == pytest.approx(1.0)
    assert quantile_steps([sticky], 1.0, 1000) == 50 and attributed[50] == pytest.approx(1.0)
    hashed, _ = curves((Component(period=20_000, hit=True, persistent=True), Component()), "one-off", 1000)
    assert within(hashed, 1000) == pytest.approx(1000 / 20_000)
    wrong, attributed = curves((Component(period=1, hit=True, hit_attributed=False),), "one-off", 10)
    assert within(wrong, 1) == 1.0 and attributed[10] == 0.0
    with pytest.raises(ValueError):
        Component(period=0)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_quick_campaign_shows_the_headline_on_the_current_code() -> None:
    from benchmarks.detection import headline_failures, plan, run

    a = run(plan(quick=True), timeout=360)
    assert headline_failures(a) == []
    checked, unverifiable, run_ = a["false_alarms"]["matmuls"]  # the campaign says what its checksums covered
    assert run_ > 0 and checked + unverifiable <= run_
    assert a["effective"] >= 15 and a["fsdp"]["effective"] >= 2 and a["shadow"]["effective"] >= 4
