"""The training side's slowness rule as pure functions: the paired comparison, the judge, and that a ``slow``
incident never raises, exits, escalates or counts as evidence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.fleet.breaker import attributed, judge_training
from sdcguard.fleet.policy import QuarantinePolicy
from sdcguard.records import Incident
from sdcguard.training.response import Responder
from sdcguard.training.rounds.pairing import peer_source, peer_target
from sdcguard.training.timing import SlowJudge, SlowWatch, pair_slowdowns

_pos = st.floats(0.2, 5.0, allow_nan=False)


def _figures(speeds: list[float], sizes: list[float], replay_cost: float, sample: int) -> tuple[list[int], list[int]]:
    """Original and replay microseconds: rank d computes its micro-batch (size[d]) and replays its source's."""
    W = len(speeds)
    original = [round(1e5 * speeds[d] * sizes[d]) for d in range(W)]
    replayed = [round(1e5 * speeds[d] * sizes[peer_source(d, sample, W)] * replay_cost) for d in range(W)]
    return original, replayed


@settings(max_examples=80, deadline=None)
@given(st.lists(_pos, min_size=2, max_size=6), st.lists(_pos, min_size=6, max_size=6), _pos, st.integers(0, 50))
def test_micro_batch_sizes_and_the_replay_overhead_cancel(
    speeds: list[float], sizes: list[float], cost: float, sample: int
) -> None:
    W = len(speeds)
    original, replayed = _figures(speeds, sizes[:W], cost, sample)
    got = pair_slowdowns(sample, original, replayed)
    for d in range(W):
        t, s = peer_target(d, sample, W), peer_source(d, sample, W)
        want = speeds[d] / math.sqrt(speeds[t] * speeds[s])
        assert got[d] == pytest.approx(want, rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(st.lists(_pos, min_size=6, max_size=6), _pos, _pos)
def test_equal_devices_are_never_named_whatever_the_work(sizes: list[float], cost: float, scale: float) -> None:
    judge = SlowJudge(SlowWatch(), [0, 1], {0: ("cpu:h:0", "h"), 1: ("cpu:h:1", "h")}, job="j", job_size=2)
    for sample in range(20):
        o, r = _figures([scale, scale], [sizes[sample % 6], sizes[(sample + 1) % 6]], cost, sample)
        assert judge.observe(sample, [[sample, o[0], r[0], 1, 1, 1], [sample, o[1], r[1], 1, 1, 1]]) == []


def test_a_consistently_slower_rank_is_named_once_with_its_figures() -> None:
    judge = SlowJudge(SlowWatch(), [0, 1], {0: ("cpu:h:0", "h"), 1: ("cpu:h:1", "h")}, job="j", job_size=2)
    found = []
    for sample in range(12):
        o, r = _figures([1.0, 1.5], [1.0, 1.0], 1.1, sample)
        found += judge.observe(
            2 * sample + 1, [[sample, o[0], r[0], 9000, 300, 50], [sample, o[1], r[1], 13000, 400, 10]]
        )
    (i,) = found
    assert i.kind == "slow" and i.suspect_ranks == (1,) and i.device == "cpu:h:1" and i.step == 9
    assert "1.50x" in i.detail and "forward+backward 13.0 ms" in i.detail and "not vetoed" in i.detail
    # a missing figure (-1: the previous step was not sampled) says nothing
    assert judge.observe(30, [[-1, 0, 0, 1, 1, 1], [-1, 0, 0, 1, 1, 1]]) == []


def _slow() -> Incident:
    return Incident(
        kind="slow",
        step=3,
        suspect_ranks=(1,),
        device="cpu:h:1",
        devices=("cpu:h:1",),
        hosts=("h",),
        detail="rank 1 is slow",
        job="j",
        job_size=2,
    )


@pytest.mark.parametrize("on_detect", ["record", "skip", "raise", "exit"])
@pytest.mark.parametrize("escalate", ["raise", "exit", "off"])
def test_a_slow_incident_never_raises_or_exits(on_detect: str, escalate: str) -> None:
    r = Responder(on_detect, None, rank=1, writer=True, escalate=escalate, job="j")
    r.handle([_slow()], escalate=[_slow()])
    assert [i.kind for i in r.incidents] == ["slow"]


def test_a_slow_incident_is_never_evidence_of_corruption() -> None:
    assert not attributed(_slow())
    many = [
        Incident(
            kind="slow",
            step=k,
            suspect_ranks=(k,),
            device=f"cpu:h:{k}",
            devices=(f"cpu:h:{k}",),
            detail="slow",
            job="j",
            job_size=4,
        )
        for k in range(4)
    ]
    verdict = judge_training(many, QuarantinePolicy())
    assert verdict.counts == {} and verdict.tripped_jobs == {}


def test_bad_watch_settings_are_refused() -> None:
    for bad in ({"threshold": 0}, {"window": 3, "min_samples": 5}, {"confidence": 1.0}):
        with pytest.raises(ValueError):
            SlowWatch(**bad)


def test_a_resumed_judge_keeps_its_samples_and_whom_it_named() -> None:
    ids = {0: ("cpu:h:0", "h"), 1: ("cpu:h:1", "h")}
    judge = SlowJudge(SlowWatch(), [0, 1], ids, job="j", job_size=2)
    for sample in range(8):
        o, r = _figures([1.0, 2.0], [1.0, 1.0], 1.0, sample)
        judge.observe(sample, [[sample, o[0], r[0], 1, 1, 1], [sample, o[1], r[1], 1, 1, 1]])
    again = SlowJudge(SlowWatch(), [0, 1], ids, job="j", job_size=2)
    again.load_state_dict(judge.state_dict())
    assert again.named == {1} and again.ranks()[1].samples == judge.ranks()[1].samples
    assert again.ranks()[1].lower_bound == pytest.approx(2.0)
