"""The rule of evidence (pure logic, no processes): software only on self-inconsistency, never a device; a
self-consistent device that others contradict is hardware; evidence that cannot pick the device is unresolved.

The distributed matrix (``test_attribution_matrix.py``) covers the same decisions end to end; these pin every
branch, and the property tests simulate any number of devices, faulty ones among them, and software noise."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.fleet.breaker import judge_training
from sdcguard.fleet.policy import QuarantinePolicy
from sdcguard.records import Incident
from sdcguard.training.digest import Digest
from sdcguard.training.identity import launcher_job_id
from sdcguard.training.verdicts.attribution import Attributor, Opinion, judge, settle
from sdcguard.training.verdicts.calibration import CalibrationReport, likely_causes
from sdcguard.training.verdicts.outcomes import Outcomes, RoundResult, conclude

GOOD = Digest(loss=1, units=(10, 20))
BAD = Digest(loss=1, units=(10, 21))
OTHER = Digest(loss=2, units=(11, 22))
IDS = {r: (f"gpu:{r}", f"host-{r}") for r in range(16)}


def d(i: int) -> Digest:
    return Digest(loss=i, units=(i, i + 1))


def peer(owner_orig: Digest, owner_rerun: Digest, replay: Digest, replay_rerun: Digest, *thirds: Digest):
    """A peer settlement: owner 0, replayer 1, third opinions 2.. (one computation each)."""
    others = [Opinion(1, replay), Opinion(0, owner_rerun), Opinion(1, replay_rerun)]
    others += [Opinion(2 + i, t) for i, t in enumerate(thirds)]
    return judge(Opinion(0, owner_orig), others)


# ------------------------------------------------------------------------------------------- the rule's rows


def test_two_devices_sticky_fault_is_unresolved_never_software() -> None:
    """The issue's first row: 2 ranks, a sticky fault on one. Both reproduce themselves: unresolved, both suspects,
    the step corrupt."""
    j = peer(BAD, BAD, GOOD, GOOD)
    assert j.verdict == "unresolved" and j.suspects == (0, 1) and j.original_corrupt and not j.inconsistent


@pytest.mark.parametrize("faulty_replayer", [False, True])
def test_two_devices_one_off_is_named_by_the_devices_own_rerun(faulty_replayer: bool) -> None:
    if faulty_replayer:
        j = peer(GOOD, GOOD, BAD, GOOD)
        assert j.verdict == "hardware" and j.blamed == {1: False} and not j.original_corrupt
    else:
        j = peer(BAD, GOOD, GOOD, GOOD)
        assert j.verdict == "hardware" and j.blamed == {0: False} and j.original_corrupt


def test_two_devices_an_intermittent_fault_that_never_repeats_its_bits_is_that_device() -> None:
    """The owner computes two different wrong results; the replayer reproduces itself: the owner had the fault."""
    j = peer(BAD, OTHER, GOOD, GOOD)
    assert j.verdict == "hardware" and j.blamed == {0: False} and j.original_corrupt


def test_two_devices_both_disagreeing_with_themselves_is_software() -> None:
    j = peer(d(1), d(2), d(3), d(4))
    assert j.verdict == "software" and j.inconsistent == (0, 1) and not j.blamed and not j.original_corrupt


@pytest.mark.parametrize("sticky", [True, False])
def test_three_devices_name_the_sticky_or_transient_owner(sticky: bool) -> None:
    j = peer(BAD, BAD if sticky else GOOD, GOOD, GOOD, GOOD)
    assert j.verdict == "hardware" and j.blamed == {0: sticky} and j.original_corrupt and j.first_unit == 1


def test_three_devices_a_sticky_replayer_is_named_and_the_step_stands() -> None:
    j = peer(GOOD, GOOD, BAD, BAD, GOOD)
    assert j.verdict == "hardware" and j.blamed == {1: True} and not j.original_corrupt


def test_a_tie_of_self_consistent_devices_is_unresolved() -> None:
    j = peer(BAD, BAD, GOOD, GOOD, BAD, GOOD)
    assert j.verdict == "unresolved" and j.suspects == (0, 1, 2, 3)


def test_one_self_inconsistent_device_among_many_is_a_transient_not_software() -> None:
    j = peer(GOOD, GOOD, BAD, OTHER, GOOD)
    assert j.verdict == "hardware" and j.blamed == {1: False}


def test_devices_of_different_setups_computing_differently_is_the_setups_doing() -> None:
    comps = {0: [GOOD, GOOD], 1: [GOOD, GOOD], 2: [BAD, BAD], 3: [BAD, BAD]}
    setups = {0: "a100", 1: "a100", 2: "h100", 3: "h100"}
    assert settle(comps, setups).verdict == "software"
    # ... but a split inside one setup is a fault
    setups = {0: "a100", 1: "a100", 2: "a100", 3: "h100"}
    comps = {0: [GOOD, GOOD], 1: [GOOD, GOOD], 2: [BAD, BAD], 3: [GOOD, GOOD]}
    j = settle(comps, setups)
    assert j.verdict == "hardware" and j.blamed == {2: True}


@pytest.mark.parametrize("wrong", [0, 1, 2])
def test_a_lone_device_of_another_setup_outvoted_by_a_strict_majority_is_that_device(wrong: int) -> None:
    """Setups A, B, B (mixed models or drivers), the A device sticky-wrong while both B devices agree: it was
    software (no device named, replay off for the run) because the setup rule ran before the majority. So is a B
    device wrong against A and the other B (the majority is of mixed setups)."""
    setups = {0: "a100", 1: "h100", 2: "h100"}
    comps = {r: [BAD, BAD] if r == wrong else [GOOD, GOOD] for r in range(3)}
    j = settle(comps, setups)
    assert j.verdict == "hardware" and j.agreed == GOOD and j.blamed == {wrong: True}
    # through judge, as a peer round settles it: the A owner's original, its rerun, the replay and third opinions
    j = judge(Opinion(0, BAD), [Opinion(1, GOOD), Opinion(0, BAD), Opinion(1, GOOD), Opinion(2, GOOD)], setups)
    assert j.verdict == "hardware" and j.original_corrupt and j.blamed == {0: True}


def test_where_no_majority_separates_a_device_from_its_setup_the_setup_rule_still_holds() -> None:
    # A vs B alone (no majority), and A, A against B, B, B (two A devices reproduce the A result: the setup)
    assert settle({0: [GOOD, GOOD], 1: [BAD, BAD]}, {0: "a100", 1: "h100"}).verdict == "software"
    setups = {0: "a100", 1: "a100", 2: "h100", 3: "h100", 4: "h100"}
    comps = {r: [BAD, BAD] if r < 2 else [GOOD, GOOD] for r in range(5)}
    assert settle(comps, setups).verdict == "software"
    assert settle(comps, None).verdict == "hardware"  # one setup: two devices wrong alike are still outvoted


@pytest.mark.parametrize(
    ("r1", "r2", "verdict", "corrupt"),
    [
        (GOOD, GOOD, "hardware", True),  # the original was a one-off: both reruns agree against it
        (BAD, GOOD, "hardware", False),  # the first rerun was the odd one: the original stands
        (OTHER, d(7), "software", False),  # all three differ on the one device
    ],
)
def test_in_one_process_the_original_and_two_reruns_vote(r1: Digest, r2: Digest, verdict: str, corrupt: bool) -> None:
    original = BAD if corrupt else GOOD
    j = judge(Opinion(0, original), [Opinion(0, r1), Opinion(0, r2)])
    assert j.verdict == verdict and j.original_corrupt is corrupt
    assert j.blamed == ({0: False} if verdict == "hardware" else {})


def test_dedicated_shadow_with_two_workers_the_shadow_is_a_voter() -> None:
    """2 workers + 1 shadow: the owner reproduces its wrong result, the shadow and the other worker agree."""
    others = [Opinion(9, GOOD), Opinion(0, BAD), Opinion(0, BAD), Opinion(1, GOOD), Opinion(1, GOOD)]
    j = judge(Opinion(0, BAD), others)
    assert j.verdict == "hardware" and j.blamed == {0: True}


# -------------------------------------------------------------------------------------------- properties


@st.composite
def settlements(draw: st.DrawFn) -> tuple[dict[int, list[Digest]], set[int], bool]:
    """Simulated opinions: ``n`` devices, some faulty (sticky: the same wrong bits each time, distinct per device;
    or transient: wrong once), optionally software noise (every computation differs)."""
    n = draw(st.integers(2, 8))
    noise = draw(st.booleans())
    faulty = set(draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True)))
    sticky = {f: draw(st.booleans()) for f in faulty}
    counts = {r: draw(st.integers(1, 3)) for r in range(n)}
    counts[0] = max(counts[0], 2)
    counter = iter(range(1000, 100000))
    comps: dict[int, list[Digest]] = {}
    for r in range(n):
        out = []
        for k in range(counts[r]):
            if noise:
                out.append(d(next(counter)))
            elif r in faulty and (sticky[r] or k == 0):
                out.append(d(100 + r))  # independent faults give different wrong bits
            else:
                out.append(GOOD)
        comps[r] = out
    return comps, faulty, noise


def sticky_like(cs: list[Digest]) -> bool:
    return all(c == cs[0] for c in cs)


@settings(max_examples=400)
@given(settlements())
def test_software_never_names_a_device_and_a_fault_is_never_software(case: tuple) -> None:
    comps, faulty, noise = case
    j = settle(comps)
    if j.verdict == "hardware":
        wrong = {r for r, cs in comps.items() if any(c != j.agreed for c in cs)}
        assert j.agreed is not None and set(j.blamed) <= wrong
        if not noise and len(faulty) <= 1:
            assert j.agreed == GOOD and set(j.blamed) <= faulty
    if noise:
        multi = [r for r, cs in comps.items() if len(cs) >= 2]
        if len(multi) >= 2:
            assert j.verdict == "software" and not j.blamed and not j.suspects
    else:
        one_offs = [r for r in faulty if len(comps[r]) >= 2 and not sticky_like(comps[r])]
        if len(one_offs) < 2:  # two devices each disagreeing with itself in one settlement is the software rule's
            assert j.verdict != "software"  # evidence: with faults only (rarer than p**2), never software
        twice_wrong = {r for r in faulty if len(comps[r]) >= 2 and all(c != GOOD for c in comps[r])}
        honest = [r for r in comps if r not in faulty]
        if j.verdict == "hardware" and j.agreed == GOOD:
            assert twice_wrong <= set(j.blamed) and all(j.blamed[r] for r in twice_wrong)
        if len(honest) * 2 > len(comps) and len(honest) >= 2 and len(one_offs) < 2:
            assert j.verdict == "hardware" and set(j.blamed) == {r for r in faulty if any(c != GOOD for c in comps[r])}


@given(st.integers(3, 12), st.integers(0, 11), st.booleans(), st.integers(1, 11))
def test_one_faulty_device_among_three_or_more_is_always_named_alone(
    world: int, faulty: int, sticky: bool, offset: int
) -> None:
    faulty, replayer = faulty % world, offset % (world - 1) + 1
    comps = {r: [GOOD] for r in range(world)}
    comps[0] = [BAD if faulty == 0 else GOOD, BAD if faulty == 0 and sticky else GOOD]
    comps[replayer] = [BAD if faulty == replayer else GOOD, BAD if faulty == replayer and sticky else GOOD]
    if faulty not in (0, replayer):
        comps[faulty] = [BAD]
    j = settle(comps)
    assert j.verdict == "hardware" and set(j.blamed) == {faulty}


@given(st.integers(4, 12), st.data())
def test_two_faulty_devices_at_once_are_both_named_when_the_others_are_a_majority(
    world: int, data: st.DataObject
) -> None:
    a, b = data.draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=2, unique=True))
    comps = {r: [d(100 + r) if r in (a, b) else GOOD] * (2 if r < 2 else 1) for r in range(world)}
    j = settle(comps)
    if world - 2 > world / 2:
        assert j.verdict == "hardware" and set(j.blamed) == {a, b}
    else:
        assert j.verdict == "unresolved"


# ------------------------------------------------------------------------------------ rounds and escalation


def test_a_round_whose_originals_were_all_one_offs_on_several_devices_is_unresolved() -> None:
    """FSDP2: one rank's corrupt contribution to an all-gather spoils every rank's original; each owner's rerun is
    right. No single device explains it: one unresolved incident naming them all, the step vetoed."""
    attr = Attributor(["a", "b"], IDS)
    settled = [
        (r, judge(Opinion(r, BAD), [Opinion(r, GOOD)] + [Opinion(q, GOOD) for q in range(3) if q != r]))
        for r in range(2)
    ]
    res = conclude(5, settled, attr, devices=3, shared_cause_at=2, result=RoundResult(step=5))
    assert res.corrupt and not res.blamed and res.suspects == {0, 1}
    assert [i.kind for i in res.incidents] == ["unresolved"]


@pytest.mark.parametrize("world", [2, 4])
def test_a_corrupted_collective_seen_by_every_replay_at_once_is_one_unresolved_incident(world: int) -> None:
    """FSDP2, one all-gather corrupted during the replay: every rank's replay of its peer's micro-batch is wrong
    once, every original and rerun right. It was one ``replay`` incident per replayer, each naming one device alone
    (each counting toward quarantine), and the step committed."""
    attr = Attributor(["a", "b"], IDS)
    settled = []
    for owner in range(world):
        replayer = (owner + 1) % world
        others = [Opinion(replayer, BAD)] + [Opinion(q, GOOD) for q in range(world)]
        j = judge(Opinion(owner, GOOD), others)
        assert j.verdict == "hardware" and j.blamed == {replayer: False} and not j.original_corrupt
        settled.append((owner, j))
    res = conclude(5, settled, attr, devices=world, shared_cause_at=2, result=RoundResult(step=5))
    assert res.corrupt and not res.blamed and res.suspects == set(range(world))
    (incident,) = res.incidents
    assert incident.kind == "unresolved" and incident.suspect_ranks == tuple(range(world)) and incident.device is None
    assert "replays" in incident.detail and incident.detail.count("computation differs") == world
    # one replay alone is still that replayer's transient, not a shared cause
    alone = conclude(5, settled[:1], attr, devices=world, shared_cause_at=2, result=RoundResult(step=5))
    assert [i.kind for i in alone.incidents] == ["replay"] and not alone.corrupt


def test_sticky_escalates_at_once_and_unresolved_on_a_repeat() -> None:
    attr = Attributor(["a", "b"], IDS)
    out = Outcomes(attr, [0, 1, 2], torch.device("cpu"), speaks=False)
    sticky = attr.replay_incidents(3, [(0, peer(BAD, BAD, GOOD, GOOD, GOOD))])
    assert out.escalating(sticky) == sticky
    transient = attr.replay_incidents(3, [(0, peer(BAD, GOOD, GOOD, GOOD, GOOD))])
    assert out.escalating(transient) == []
    unresolved = [attr.unresolved(4, 0, peer(BAD, BAD, GOOD, GOOD), alone=True)]
    assert out.escalating(unresolved) == [] and out.escalating(unresolved) == unresolved


def test_software_round_names_nobody_and_vetoes_nothing() -> None:
    attr = Attributor(["a", "b"], IDS)
    out = Outcomes(attr, [0, 1], torch.device("cpu"), speaks=False)
    res = conclude(
        2, [(0, peer(d(1), d(2), d(3), d(4)))], attr, devices=2, shared_cause_at=3, result=RoundResult(step=2)
    )
    found = out.settled(res)
    assert [i.kind for i in found] == ["nondeterministic"] and not found[0].suspect_ranks and not res.corrupt
    assert out.determinism.state == "nondeterministic"


def test_incidents_name_the_device_and_merge_a_sticky_devices_two_mismatches() -> None:
    a = Attributor(["embed.weight", "head.weight"], IDS, job="j1", job_size=3)
    own = peer(BAD, BAD, GOOD, GOOD, GOOD)
    replayed = judge(Opinion(2, GOOD), [Opinion(0, BAD), Opinion(0, BAD), Opinion(2, GOOD), Opinion(1, GOOD)])
    [incident] = a.replay_incidents(3, [(0, own), (2, replayed)])
    assert incident.kind == "replay" and incident.suspect_ranks == (0,) and incident.device == "gpu:0"
    assert incident.hosts == ("host-0",) and incident.sticky is True and incident.parameter == "head.weight"
    assert "rank 0's micro-batch" in incident.detail and "rank 2's micro-batch" in incident.detail
    assert incident.job == "j1" and incident.job_size == 3


def test_a_nondeterministic_incident_names_no_device() -> None:
    inc = Attributor(["w"], IDS).nondeterministic(5, "no two of 3 computations agree", ["x"])
    assert inc.kind == "nondeterministic" and inc.suspect_ranks == () and inc.device is None


def test_likely_causes_name_order_dependent_ops_and_uncaptured_generators() -> None:
    causes = likely_causes({"index_add_", "mm", "<generator>"}, torch.device("cpu"))
    assert any("index_add" in c for c in causes) and any("torch.Generator" in c for c in causes)
    assert likely_causes(set(), torch.device("cpu"))  # never empty
    report = CalibrationReport(
        deterministic=False,
        same_device=False,
        cross_rank=False,
        causes=("x",),
        verdict="software",
        ranks_differing=(0, 1),
    )
    assert "NOT bit-identical on the same device" in str(report)


# ---------------------------------------------------------------------------------------------- job ids


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORCHELASTIC_RUN_ID": "none"}, None),
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "42"}, "42"),
        ({"TORCHELASTIC_RUN_ID": "abc-123"}, "abc-123"),
        ({}, None),
    ],
)
def test_torchruns_placeholder_is_not_a_job_id(
    monkeypatch: pytest.MonkeyPatch, env: dict, expected: str | None
) -> None:
    for k in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launcher_job_id() == expected


def _named(job: str | None, device: str, size: int | None, sticky: bool = False) -> Incident:
    return Incident(
        kind="replay",
        step=1,
        suspect_ranks=(0,),
        device=device,
        devices=(device,),
        detail="x",
        job=job,
        job_size=size,
        sticky=sticky,
    )


def test_the_training_breaker_never_pools_jobs_and_weighs_devices_against_the_jobs_size() -> None:
    policy = QuarantinePolicy()
    # three faulty devices in three different jobs, or with no job id: nothing trips
    spread = [_named(None, f"GPU-{i}", None) for i in range(3)] + [_named(f"j{i}", f"GPU-x{i}", 8) for i in range(3)]
    assert not judge_training(spread, policy).tripped_jobs
    # three faulty devices in one job of 10,000: plausible hardware, not software
    big = [_named("big", f"GPU-{i}", 10_000) for i in range(3)]
    v = judge_training(big, policy)
    assert not v.tripped_jobs and all(v.counts[f"GPU-{i}"] == 1 for i in range(3))
    # three of a four-device job, none reproducing its fault: the pattern software leaves
    small = [_named("small", f"GPU-{i}", 4) for i in range(3)]
    assert "small" in judge_training(small, policy).tripped_jobs
    # ... unless the devices reproduced their faults (sticky): hardware evidence
    sticky = [_named("small", f"GPU-{i}", 4, sticky=True) for i in range(3)]
    assert not judge_training(sticky, policy).tripped_jobs
