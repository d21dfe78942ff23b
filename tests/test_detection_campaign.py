"""The detection campaign's core (``benchmarks/detection.py``) on a handful of faults in a real 3-rank gloo job:
sdcguard detects and names the faulty rank for every fault that changes the step's result, same-device replay
misses a sticky compute fault (it repeats on the same device), and a clean stretch raises nothing.
"""

from __future__ import annotations

import pytest

from benchmarks.detection import Campaign, LossSpikeDetector, Trial, run

pytestmark = [pytest.mark.distributed]


def test_loss_spike_detector_follows_megatron() -> None:
    d = LossSpikeDetector(num_samples=3)
    assert [d.check(v, 1.0, 1.0) for v in (2.0, -4.0, 3.0)] == [[], [], []]  # learning the max |loss| (4)
    assert d.check(39.9, 1.0, 1.0) == [] and d.check(-40.0, 1.0, 1.0) == ["spiky_loss"]
    assert d.check(float("nan"), 1.0, 1.0) == ["nonfinite_loss"]  # NaN is checked separately, never "spiky"
    assert d.check(1.0, float("inf"), float("nan")) == ["nonfinite_local_grad", "nonfinite_grad_norm"]
    assert "nonfinite_grad_norm" not in LossSpikeDetector.NAMING  # the global check names no rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_campaign_core_detects_attributes_and_shows_what_same_device_replay_misses() -> None:
    trials = (
        Trial(target="matmul", bits="exponent", timing="transient", rank=1, seed=11),
        Trial(target="norm", bits="high_mantissa", timing="sticky", rank=2, seed=12),
        Trial(target="reduced_grad", bits="sign", timing="transient", rank=0, seed=13),
        Trial(target="weights", bits="exponent", timing="sticky", rank=1, seed=14),
        Trial(target="collective", bits="nan", timing="transient", rank=2, seed=15),
    )
    result = run(Campaign(trials=trials, clean_steps=12, latency=((1, "sticky", 3),), latency_cap=5), timeout=100)

    fp = result["false_positives"]
    assert fp["steps"] == 12 and fp["calibrated_deterministic"]
    assert fp["sdcguard"] == 0 and fp["same_device"] == 0
    judged = result["trials"]
    assert all(j["changed_elements"] >= 1 for j in judged)  # the injector changed something every time
    for j in judged:
        if j["effective"]:
            assert j["sdcguard"]["detected"] and j["sdcguard"]["suspects"] == [j["rank"]], j
    assert sum(j["effective"] for j in judged) >= 4
    by_target = {j["target"]: j for j in judged}
    sticky = by_target["norm"]
    assert sticky["effective"] and not sticky["same_device"]["detected"]  # the re-run repeats the fault
    transient = by_target["matmul"]
    assert transient["effective"] and transient["same_device"]["attributed"]
    assert by_target["collective"]["loss_spike"]["detected"]  # a NaN reaches the gradient norm
    (lat,) = result["latency"]
    assert lat["detected"] == 1 and lat["attributed"] == 1 and lat["max"] == 0
