"""Attribution: who is blamed for a replay mismatch, from the opinions gathered (pure logic, no processes).

The distributed guard tests cover the same decisions end to end; these pin every branch of the decision table,
including the ones a 3-rank job rarely reaches (two devices only, a third opinion agreeing with neither)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.attribution import Attributor, Conflict
from sdcguard.calibration import CalibrationReport, likely_causes
from sdcguard.replay import Digest
from sdcguard.shadows import digest_hash

GOOD = Digest(loss=1, buckets=(10, 20))
BAD = Digest(loss=1, buckets=(10, 21))
OTHER = Digest(loss=2, buckets=(11, 22))

MEMBERS = [4, 5, 6]  # global ranks of data-parallel indices 0, 1, 2
IDS = {4: ("gpu:a", "host-a"), 5: ("gpu:b", "host-b"), 6: ("gpu:c", "host-c")}


def attributor() -> Attributor:
    return Attributor(MEMBERS, ["embed.weight", "head.weight"], IDS)


def conflict(original: Digest, other: int | None = 1) -> Conflict:
    return Conflict(owner=0, other=other, other_global=MEMBERS[other] if other is not None else 9,
                    original=original, parameter=1, loss_differs=False)


@pytest.mark.parametrize(("rerun", "sticky"), [(BAD, True), (GOOD, False)])
def test_a_third_replay_agreeing_with_the_replica_blames_the_owner(rerun: Digest, sticky: bool) -> None:
    a = attributor()
    suspects, got_sticky, how, _ = a.settle(conflict(BAD), replica=GOOD, third=GOOD, third_rank=2, rerun=rerun,
                                            other_rerun=GOOD)
    assert suspects == (4,) and got_sticky is sticky
    assert "rank 6's replay agrees with rank 5" in how


def test_a_third_replay_agreeing_with_the_original_blames_the_replayer() -> None:
    suspects, sticky, how, _ = attributor().settle(conflict(GOOD), replica=BAD, third=GOOD, third_rank=2,
                                                   rerun=GOOD, other_rerun=BAD)
    assert suspects == (5,) and sticky is True and "rank 5 computed the replay wrong" in how


def test_a_third_replay_agreeing_with_neither_blames_both() -> None:
    suspects, sticky, _, _ = attributor().settle(conflict(GOOD), replica=BAD, third=OTHER, third_rank=2,
                                                 rerun=GOOD, other_rerun=BAD)
    assert suspects == (4, 5) and sticky is None


def test_two_devices_only_the_reruns_decide() -> None:
    a = attributor()
    # the owner's re-run agrees with the replica: the owner's original was a transient
    assert a.settle(conflict(BAD), replica=GOOD, third=None, third_rank=None, rerun=GOOD,
                    other_rerun=GOOD)[:2] == ((4,), False)
    # the replayer's re-run agrees with the original: the replay was a transient
    assert a.settle(conflict(GOOD), replica=BAD, third=None, third_rank=None, rerun=GOOD,
                    other_rerun=GOOD)[:2] == ((5,), False)
    # each reproduces its own result: undecidable, both named
    assert a.settle(conflict(GOOD), replica=BAD, third=None, third_rank=None, rerun=GOOD,
                    other_rerun=BAD)[:2] == ((4, 5), None)


def test_a_dedicated_shadow_is_compared_by_its_digest_hash() -> None:
    suspects, sticky, how, _ = attributor().settle(conflict(BAD, other=None), replica=None,
                                                   replica_hash=digest_hash(GOOD), third=GOOD, third_rank=1,
                                                   rerun=BAD, other_rerun=None)
    assert suspects == (4,) and sticky is True and "(dedicated shadow)" in how


def test_merge_gives_one_incident_per_suspect_set_naming_device_host_and_parameter() -> None:
    a = attributor()
    sticky_own = ((4,), True, "own", conflict(BAD))
    sticky_replay = ((4,), None, "replay", Conflict(owner=1, other=0, other_global=4, original=GOOD, parameter=0,
                                                     loss_differs=True))
    (incident,) = a.merge(7, [sticky_own, sticky_replay])
    assert incident.kind == "replay" and incident.step == 7 and incident.suspect_ranks == (4,)
    assert incident.device == "gpu:a" and incident.hosts == ("host-a",) and incident.sticky is True
    assert incident.parameter == "head.weight"
    assert "rank 4's micro-batch" in incident.detail and "rank 5's micro-batch" in incident.detail
    two = a.merge(7, [((4, 5), None, "neither", conflict(GOOD))])
    assert two[0].device is None and two[0].devices == ("gpu:a", "gpu:b")


def test_nondeterministic_incidents_blame_nobody() -> None:
    incident = attributor().nondeterministic(3, conflict(BAD))
    assert incident.kind == "nondeterministic" and incident.suspect_ranks == () and incident.device is None
    assert "not blamed on hardware" in incident.detail


@given(st.permutations([GOOD, BAD, OTHER]), st.sampled_from([GOOD, BAD, OTHER]), st.booleans())
def test_the_verdict_never_names_a_rank_outside_the_two_that_disagree(
    opinions: list[Digest], rerun: Digest, has_third: bool
) -> None:
    original, replica, third = opinions
    suspects, _, how, _ = attributor().settle(conflict(original), replica=replica,
                                              third=third if has_third else None, third_rank=2 if has_third else None,
                                              rerun=rerun, other_rerun=rerun)
    assert suspects and set(suspects) <= {4, 5} and how


def test_calibration_names_likely_causes() -> None:
    causes = likely_causes({"index_add_", "mm", "scatter_add"}, torch.device("cpu"))
    assert any("index_add_" in c and "scatter_add" in c for c in causes)
    if not torch.are_deterministic_algorithms_enabled():
        assert "deterministic algorithms are off" in causes[0]
    assert likely_causes(set(), torch.device("cpu"))  # never empty
    report = CalibrationReport(deterministic=False, same_device=True, cross_rank=False, causes=("x",))
    assert "NOT bit-identical (across ranks)" in str(report) and "x" in str(report)
