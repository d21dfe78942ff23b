"""The planning model's invariants: Young's and Daly's intervals are their formulas and grow with the time between
failures; goodput is a share of time that failures, checkpoints and restarts only lower and in-place recovery
raises; a cadence's detection and cost move the right way with its periods, reproduce the campaign's figures at the
defaults, and the chosen cadence meets its targets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.errors import BadInput
from sdcguard.fleet.plan.cadence import CAMPAIGN, cadence, choose_cadence
from sdcguard.fleet.plan.intervals import RecoveryCost, daly, goodput, goodput_with_recovery, young

seconds = st.floats(1.0, 1e6)


@given(seconds, seconds)
def test_young_and_daly_are_their_formulas(c: float, m: float) -> None:
    assert young(c, m) == pytest.approx(math.sqrt(2 * c * m), rel=1e-12)
    r = c / (2 * m)
    expected = m if c >= 2 * m else math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c
    assert daly(c, m) == pytest.approx(expected, rel=1e-12)
    if c < m / 100:  # far from the bound, Daly is Young less about the checkpoint's cost
        assert abs(daly(c, m) - (young(c, m) - c)) < 0.1 * young(c, m)


@given(seconds, seconds, st.floats(1.01, 100))
def test_the_interval_grows_with_the_time_between_failures(c: float, m: float, more: float) -> None:
    assert young(c, m * more) > young(c, m)
    if c < 2 * m:  # Daly's estimate is piecewise: at C = 2M it jumps from its expansion to M (docs/plan.md)
        assert daly(c, m * more) >= daly(c, m)


@given(seconds, st.floats(1.0, 1e4), st.floats(0.0, 1e4), seconds, st.floats(1.01, 100))
def test_goodput_is_a_share_that_failures_lower(t: float, c: float, r: float, m: float, more: float) -> None:
    g = goodput(t, c, r, m)
    assert 0 <= g < 1  # 0 where failures come far faster than the restarts finish
    assert goodput(t, c, r, m * more) >= g
    assert goodput(t, c, r, math.inf) >= goodput(t, c, r, m * more)
    assert goodput(t, c, r, math.inf) == pytest.approx(t / (t + c))


@given(st.floats(1e-7, 1e-3), st.floats(1e-7, 1e-3), st.floats(60, 3600))
def test_recovering_in_place_beats_restarting(loud: float, sdc: float, restart: float) -> None:
    """The same SDC events recovered in memory at a cost below what a restart loses (its restart time and the work
    since the checkpoint) give more goodput than counted as interruptions; with none, recovery changes nothing."""
    c = 60.0
    both = 1 / (loud + sdc)
    restarting = goodput(daly(c, both), c, restart, both)
    interval = daly(c, 1 / loud)
    cheap = RecoveryCost(lost_s=1.0, recovery_s=1.0)  # less than any restart here (>= 60 s)
    recovering = goodput_with_recovery(interval, c, restart, loud_per_s=loud, recoverable_per_s=sdc, cost=cheap)
    assert recovering > restarting
    none = goodput_with_recovery(interval, c, restart, loud_per_s=loud, recoverable_per_s=0.0, cost=cheap)
    assert none == goodput(interval, c, restart, 1 / loud)


def test_bad_input_is_one_line() -> None:
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(BadInput, match="positive number of seconds"):
            young(bad, 100)
    with pytest.raises(BadInput, match="replay_every"):
        cadence(0, 4)
    with pytest.raises(BadInput, match="--max-overhead"):
        choose_cadence(max_unverified_steps=10, max_overhead=0)


def test_the_defaults_reproduce_the_campaign() -> None:
    """docs/detection.md at the defaults: one-off compute faults 5.4% caught, sticky ones a median of 21 steps;
    replay alone 2% and 25; own work 3.4% for replay and the every-step check."""
    d = cadence(50, 4)
    assert d.one_off_caught == pytest.approx(0.054, abs=0.005) and d.sticky_mean_steps == pytest.approx(21, abs=1.5)
    alone = cadence(50, 0)
    assert alone.one_off_caught == pytest.approx(0.02) and alone.sticky_mean_steps == pytest.approx(24.5)
    assert alone.overhead == pytest.approx(0.034)
    assert cadence(1, 0).one_off_caught == 1.0 and cadence(1, 0).sticky_worst_steps == 0


@given(st.integers(1, 500), st.integers(0, 50), st.integers(1, 500))
def test_a_shorter_period_catches_more_and_costs_more(r: int, k: int, more: int) -> None:
    a, b = cadence(r, k), cadence(r + more, k)
    assert a.one_off_caught >= b.one_off_caught and a.sticky_mean_steps <= b.sticky_mean_steps
    assert a.overhead > b.overhead and a.sticky_worst_steps < b.sticky_worst_steps
    if k:
        assert cadence(r, k).one_off_caught >= cadence(r, 0).one_off_caught
        assert cadence(r, k).overhead == pytest.approx(cadence(r, 0).overhead + CAMPAIGN.per_checked_step / k)


@given(st.integers(1, 1000), st.floats(0.001, 2.0))
def test_the_chosen_cadence_meets_its_targets(steps: int, overhead: float) -> None:
    chosen, why = choose_cadence(max_unverified_steps=steps, max_overhead=overhead)
    assert chosen.sticky_worst_steps == steps
    if why is None:
        assert chosen.overhead <= overhead + 1e-12
        if chosen.checksum_every > 1:  # the most frequent checks the budget pays for
            assert cadence(chosen.replay_every, chosen.checksum_every - 1).overhead > overhead
    else:
        assert chosen.overhead > overhead and chosen.checksum_every == 0
