"""Attribution: blame needs a majority of independent devices (pure logic, no processes).

The distributed guard tests cover the same decisions end to end; these pin every branch of the rule, including
the ones a real job rarely reaches (two devices only, a tie, software that makes every computation differ)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.training.attribution import Attributor, Opinion, judge
from sdcguard.training.calibration import CalibrationReport, Determinism, likely_causes
from sdcguard.training.taps import Digest

GOOD = Digest(loss=1, units=(10, 20))
BAD = Digest(loss=1, units=(10, 21))
OTHER = Digest(loss=2, units=(11, 22))
IDS = {4: ("gpu:a", "host-a"), 5: ("gpu:b", "host-b"), 6: ("gpu:c", "host-c")}


def reruns(*values: Digest) -> list[Opinion]:
    return [Opinion(4 + i, d) for i, d in enumerate(values)]


@pytest.mark.parametrize(("owner_rerun", "sticky"), [(BAD, True), (GOOD, False)])
def test_the_owner_is_blamed_when_the_other_devices_outvote_its_original(owner_rerun: Digest, sticky: bool) -> None:
    j = judge(Opinion(4, BAD), Opinion(5, GOOD), reruns(owner_rerun, GOOD, GOOD))
    assert j.agreed == GOOD and j.original_corrupt and j.blamed == {4: sticky}
    assert j.first_unit == 1


def test_a_replayer_that_computed_the_replay_wrong_is_blamed_and_the_step_stands() -> None:
    j = judge(Opinion(4, GOOD), Opinion(5, BAD), reruns(GOOD, BAD, GOOD))
    assert j.agreed == GOOD and not j.original_corrupt and j.blamed == {5: True}


def test_no_two_computations_agreeing_is_software_and_names_nobody() -> None:
    j = judge(Opinion(4, GOOD), Opinion(5, BAD), reruns(OTHER, Digest(loss=3, units=(1, 2)), BAD))
    assert j.agreed is None and j.blamed == {} and not j.original_corrupt
    assert "nondeterminism" in j.how


def test_two_devices_each_reproducing_their_own_result_cannot_be_decided() -> None:
    """The hardest case for two devices: a sticky fault looks exactly like two devices that differ in software."""
    j = judge(Opinion(4, BAD), Opinion(5, GOOD), reruns(BAD, GOOD))
    assert j.agreed is None and j.blamed == {}
    # ... but two devices agreeing against one original is a majority: a one-off fault on the owner
    j = judge(Opinion(4, BAD), Opinion(5, GOOD), reruns(GOOD, GOOD))
    assert j.agreed == GOOD and j.blamed == {4: False} and j.original_corrupt


def test_a_tie_names_nobody() -> None:
    j = judge(Opinion(4, BAD), Opinion(5, GOOD), [*reruns(BAD, BAD, GOOD), Opinion(7, GOOD)])
    assert j.agreed is None and j.blamed == {}


@pytest.mark.parametrize(("r1", "r2", "agreed", "corrupt"), [
    (GOOD, GOOD, GOOD, True),  # the original was a one-off: both reruns agree against it
    (BAD, GOOD, GOOD, False),  # the first rerun was the odd one: the original stands
    (OTHER, BAD, None, False),  # all three differ: nondeterminism
])
def test_in_one_process_the_original_and_two_reruns_vote(r1: Digest, r2: Digest, agreed: Digest | None,
                                                         corrupt: bool) -> None:
    original = BAD if corrupt else GOOD
    j = judge(Opinion(0, original), None, [Opinion(0, r1), Opinion(0, r2)])
    assert j.agreed == agreed and j.original_corrupt is corrupt
    assert j.blamed == ({} if agreed is None else {0: False})


values = st.sampled_from([GOOD, BAD, OTHER, Digest(loss=9, units=(9, 9))])


@given(st.integers(3, 9), st.integers(0, 8), st.booleans(), st.integers(0, 8))
def test_one_faulty_device_among_three_or_more_is_always_named_alone(world: int, faulty: int, sticky: bool,
                                                                     replayer: int) -> None:
    faulty, replayer = faulty % world, replayer % world
    if replayer == 0:
        replayer = 1
    # the faulty device spoils the original if it owns it, its replay if it replays, its rerun if sticky
    original = BAD if faulty == 0 else GOOD
    replay = BAD if faulty == replayer else GOOD
    votes = [Opinion(r, BAD if r == faulty and (sticky or r not in (0, replayer)) else GOOD) for r in range(world)]
    j = judge(Opinion(0, original), Opinion(replayer, replay), votes)
    assert j.agreed == GOOD
    assert set(j.blamed) == {faulty} and j.original_corrupt is (faulty == 0)


@given(st.lists(values, min_size=2, max_size=7), values, values)
def test_a_blamed_device_always_computed_something_the_majority_contradicts(votes: list[Digest], original: Digest,
                                                                             replay: Digest) -> None:
    ops = [Opinion(r, d) for r, d in enumerate(votes)]
    j = judge(Opinion(0, original), Opinion(1, replay), ops)
    if j.agreed is None:
        assert j.blamed == {} and not j.original_corrupt
        return
    support = sum(1 for d in votes if d == j.agreed)
    assert support * 2 > len(votes) and support >= 2
    for rank in j.blamed:
        mine = [d for r, d in enumerate(votes) if r == rank] + ([original] if rank == 0 else []) + (
            [replay] if rank == 1 else [])
        assert any(d != j.agreed for d in mine)


def test_incidents_name_the_device_and_merge_a_sticky_devices_two_mismatches() -> None:
    a = Attributor(["embed.weight", "head.weight"], IDS)
    own = judge(Opinion(4, BAD), Opinion(5, GOOD), reruns(BAD, GOOD, GOOD))
    replayed = judge(Opinion(6, GOOD), Opinion(4, BAD), [Opinion(4, BAD), Opinion(5, GOOD), Opinion(6, GOOD)])
    [incident] = a.replay_incidents(3, [(4, own), (6, replayed)])
    assert incident.kind == "replay" and incident.suspect_ranks == (4,) and incident.device == "gpu:a"
    assert incident.hosts == ("host-a",) and incident.sticky is True and incident.parameter == "head.weight"
    assert "rank 4's micro-batch" in incident.detail and "rank 6's micro-batch" in incident.detail


def test_a_nondeterministic_incident_names_no_device() -> None:
    inc = Attributor(["w"], IDS).nondeterministic(5, "no two of 3 computations agree", ["x"])
    assert inc.kind == "nondeterministic" and inc.suspect_ranks == () and inc.device is None


def test_blame_moving_between_devices_is_taken_for_software() -> None:
    d = Determinism(window=5)
    assert d.blamed(0, {4}) is None and d.blamed(3, {4}) is None  # one device, again: hardware
    assert "2 different devices" in (d.blamed(4, {5}) or "")
    d = Determinism(window=5)
    assert d.blamed(0, {4}) is None and d.blamed(5, {5}) is None  # far enough apart: two separate faults


def test_likely_causes_name_order_dependent_ops_and_uncaptured_generators() -> None:
    causes = likely_causes({"index_add_", "mm", "<generator>"}, torch.device("cpu"))
    assert any("index_add" in c for c in causes) and any("torch.Generator" in c for c in causes)
    assert likely_causes(set(), torch.device("cpu"))  # never empty
    report = CalibrationReport(deterministic=False, same_device=False, cross_rank=True, causes=("x",))
    assert "NOT bit-identical (on the same device)" in str(report)
