"""The attribution matrix, end to end on real gloo processes: world sizes 2, 3 and 4 data-parallel ranks; peer
replay (DDP), a dedicated shadow (DDP, one more rank) and FSDP2; every kind of fault in one long run per job
(``tests/_matrix.py``: present from step 0, one-off, intermittent, sticky, two devices at once, two at different
times); a model that replays bit for bit or one that does not; ``calibrate()`` called or not. In every cell:

- a hardware fault is never labelled software (no ``nondeterministic`` incident, replay stays on to the end);
- software nondeterminism never names a device, and its steps commit;
- a corrupted step is never committed silently: peer and FSDP2 veto every step whose original a fault touched; a
  dedicated shadow, which cannot veto, reports every sample whose original a fault touched;
- a device named alone is always one that was faulty at that step;
- every rank decides alike.

The ``recover`` column (``escalate="recover"``, ``tests/training/recovery/_matrix.py``): world sizes 2, 3 and 4
workers, peer replay or one dedicated shadow as a spare, sticky faults on one or two workers. In every cell no rank
hangs (the timeout), no healthy rank leaves (only a faulty rank exits 86), and no unverified state commits: every
rank that finishes holds, bit for bit, the state of a fault-free run through the same groups.

CI runs one cell per row of the rule table of docs/guard.md (``-m "not matrix"`` keeps the rest out of ``make test``);
``pytest -m matrix tests/training/verdicts/test_attribution_matrix.py`` runs the whole matrix (its result is in
docs/guard.md); of the ``recover`` column CI runs one cell (3 workers and a spare, one faulty worker).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from sdcguard.testing import run_ranks
from tests._matrix import CLEAN_TAIL, STEPS, cell, faulty_at

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

NAMING = ("replay", "calibration")


def _check_deterministic(kind: str, results: list[dict[str, Any]], calibrate: bool) -> None:
    workers = results[0]["workers"]
    ranks = results[:workers]
    for res in ranks:
        alike = {s: (c, checks, inc) for s, (c, _, checks, inc) in res["steps"].items()}
        assert alike == {s: (c, checks, inc) for s, (c, _, checks, inc) in ranks[0]["steps"].items()}
        assert res["closing"] == ranks[0]["closing"]  # every rank decides alike
        assert res["state"] != "nondeterministic", res["state"]
    steps = ranks[0]["steps"]
    reported = [(inc, s) for s in range(STEPS) for inc in steps[s][3]] + [(i, STEPS) for i in ranks[0]["closing"]]
    found = [inc for inc, _ in reported]
    assert not [i for i in found if i[0] == "nondeterministic"], found  # never software
    for (kind_, step, suspects, _), at in reported:  # a device named alone was faulty at that step (a shadow's
        if kind_ in NAMING and len(suspects) == 1:  # verdict is settled later: faulty by the time it was settled)
            when = range(step, at + 1) if kind == "shadow" else [step]
            assert any(suspects[0] in faulty_at(workers, t) for t in when), (step, at, suspects)
    touched = {s: [r for r in range(workers) if ranks[r]["steps"][s][1]] for s in range(STEPS)}
    for s, who in touched.items():
        if not who:
            continue
        if kind == "shadow":  # sample s checks worker s % workers; its verdict is reported later
            owner = s % workers
            if owner in who:
                assert any(step == s and owner in sus for _, step, sus, _ in found), (s, who, found)
        else:
            assert not steps[s][0], (s, who, steps[s])  # vetoed on every rank
    for s in CLEAN_TAIL:  # replay still on after every fault; clean steps commit
        assert steps[s][0] and "replay" in steps[s][2], (s, steps[s])
    if calibrate:
        verdict, differing, deterministic = ranks[0]["calibration"]
        assert deterministic and verdict != "software"
        if workers >= 3:
            assert verdict == "hardware" and differing == (1,), ranks[0]["calibration"]
        else:
            assert verdict == "unresolved" and differing == (0, 1), ranks[0]["calibration"]


def _check_software(kind: str, results: list[dict[str, Any]], calibrate: bool) -> None:
    workers = results[0]["workers"]
    for res in results[:workers]:
        found = [inc for s in range(STEPS) for inc in res["steps"][s][3]] + res["closing"]
        assert all(not suspects for _, _, suspects, _ in found), found  # never a device
        assert all(res["steps"][s][0] for s in range(STEPS))  # its steps commit
        # (a dedicated shadow replays each sample exactly once, as its worker computed it once: the model's own
        # generator, advanced once per computation on both, happens to replay; calibrate() desynchronises it)
        assert res["state"] == "nondeterministic" or (kind == "shadow" and not calibrate), res["state"]
        if calibrate:
            assert res["calibration"][0] == "software"


def _run(kind: str, dp: int, deterministic: bool, calibrate: bool) -> None:
    world = dp + 1 if kind == "shadow" else dp
    results = run_ranks(cell, world, kind, deterministic, calibrate, deterministic, timeout=280)
    if deterministic:
        _check_deterministic(kind, results, calibrate)
    else:
        _check_software(kind, results, calibrate)


# One cell per row of the rule table of docs/guard.md (CI).
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("kind", "dp", "deterministic", "calibrate"),
    [
        ("peer", 2, True, True),  # two devices: unresolved at calibrate and for sticky faults; one-offs named
        ("peer", 3, True, False),  # a majority names every faulty device: one-off, sticky, two at different times
        ("fsdp", 2, True, False),  # FSDP2's collective replay
        ("shadow", 2, True, False),  # 2 workers + 1 shadow: the shadow is a voter
        ("peer", 3, False, True),  # software: devices disagree with themselves
    ],
)
def test_rule_table_rows(kind: str, dp: int, deterministic: bool, calibrate: bool) -> None:
    _run(kind, dp, deterministic, calibrate)


CI_CELLS = {
    ("peer", 2, True, True),
    ("peer", 3, True, False),
    ("fsdp", 2, True, False),
    ("shadow", 2, True, False),
    ("peer", 3, False, True),
}
MATRIX = [
    c
    for c in itertools.product(("peer", "shadow", "fsdp"), (2, 3, 4), (True, False), (True, False))
    if c not in CI_CELLS
]


@pytest.mark.matrix
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("kind", "dp", "deterministic", "calibrate"), MATRIX)
def test_matrix(kind: str, dp: int, deterministic: bool, calibrate: bool) -> None:
    _run(kind, dp, deterministic, calibrate)


@pytest.mark.timeout(200)
def test_mixed_setups_a_lone_device_outvoted_by_a_strict_majority_is_named_never_software() -> None:
    """Setups A, B, B: the A device sticky-wrong while both B devices agree was ``software`` (no device named,
    replay off for the run). Every faulty step is vetoed and names its device alone; replay stays on."""
    from tests._matrix import MIXED_FAULTS, mixed_setup_cell

    results = run_ranks(mixed_setup_cell, 3, timeout=180)
    steps = results[0]["steps"]
    assert all(r["steps"] == steps for r in results) and results[0]["state"] != "nondeterministic"
    for step, (commit, checks, incidents) in steps.items():
        assert "replay" in checks and not [i for i in incidents if i[0] == "nondeterministic"]
        if step in MIXED_FAULTS:
            rank, timing = MIXED_FAULTS[step]
            assert not commit and [(i[0], i[2], i[3]) for i in incidents] == [("replay", (rank,), timing == "sticky")]
        else:
            assert commit and not incidents, (step, incidents)


@pytest.mark.timeout(200)
def test_a_collective_corrupted_under_every_replay_is_one_shared_cause_incident_and_vetoed() -> None:
    """FSDP2, one all-gather corrupted during the replay: it was one ``replay`` incident per rank, each naming one
    device alone (each counting toward quarantine), and the step committed."""
    from tests._matrix import replay_collective_cell

    results = run_ranks(replay_collective_cell, 3, timeout=180)
    steps = results[0]["steps"]
    assert all(r["steps"] == steps for r in results) and results[0]["hits"] == 1
    commit, checks, incidents = steps[2]
    assert not commit and [(i[0], i[2]) for i in incidents] == [("unresolved", (0, 1, 2))]
    commit, checks, incidents = steps[4]
    assert not commit and [(i[0], i[2], i[3]) for i in incidents] == [("replay", (1,), True)]
    for step in (0, 1, 3, 5, 6):
        assert steps[step][0] and not steps[step][2] and "replay" in steps[step][1], (step, steps[step])
    assert results[0]["state"] != "nondeterministic"


@pytest.mark.timeout(200)
def test_a_sticky_fault_at_the_defaults_escalates_at_its_first_sample_naming_the_device() -> None:
    """``replay_every=50``: the fault starts at step 2, the sample at step 50 names rank 1 sticky, and every rank
    raises there (vetoing 1 step in 50 would commit the other 49 corrupted ones)."""
    from tests._matrix import escalation

    results = run_ranks(escalation, 3, "raise", 120, timeout=180)
    for res in results:
        assert res["raised"] == 50
        [(kind, suspects, sticky, device)] = res["named"]
        assert (kind, suspects, sticky) == ("replay", (1,), True) and device


@pytest.mark.timeout(200)
def test_escalate_exit_leaves_by_the_exit_code_contract() -> None:
    from tests._matrix import escalation

    results = run_ranks(escalation, 3, "exit", 60, timeout=180)
    assert [r["exit"] for r in results] == [85, 86, 85] and all(r["at"] == 50 for r in results)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("escalate", ["raise", "exit"])
def test_an_escalation_reaches_the_dedicated_shadow_too(escalate: str) -> None:
    """2 workers + 1 dedicated shadow, a sticky fault on a worker: the workers raised as designed while the shadow
    was never told and waited in ``guard.serve()``'s receive until the timeout, so a job that catches the exception
    to checkpoint and leave hung instead of ending. Now the shadow raises (or exits) too."""
    from tests._matrix import shadow_escalation

    results = run_ranks(shadow_escalation, 3, escalate, timeout=150)
    if escalate == "raise":
        named = {tuple(map(tuple, r["raised"])) for r in results}
        assert len(named) == 1  # every rank, the shadow included, raised for the same incidents
        assert any(kind == "replay" and suspects == (1,) and sticky for kind, suspects, sticky in next(iter(named)))
    else:
        assert [r["exit"] for r in results] == [85, 86, 85]  # the suspect worker 86, the other worker and the shadow 85


@pytest.mark.timeout(120)
def test_an_fsdp2_replay_puts_the_users_gradient_sync_setting_back() -> None:
    from tests._matrix import fsdp_sync_kept

    for settings in run_ranks(fsdp_sync_kept, 2, timeout=100):
        assert settings and not any(settings)  # still off, as the user left it


def _recover(kind: str, workers: int, count: int) -> None:
    from tests.training.recovery._matrix import faults, recover_cell, reference

    world = workers + 1 if kind == "shadow" else workers
    results = run_ranks(recover_cell, world, kind, count, timeout=250)
    faulty = set(faults(workers, count))
    for rank, r in enumerate(results):
        assert r["ended"] in ("finished", "shadow", 85, 86), (rank, r)
        assert r["ended"] != 86 or rank in faulty, (rank, r)  # no healthy rank leaves
    finished = {rank: r for rank, r in enumerate(results) if r["ended"] == "finished"}
    healthy = set(range(world)) - faulty
    if not finished:  # only where two replicas were left to tell a faulty one from a healthy one: unresolved, the
        # job leaves by the contract with 85 (86 only on a rank a recovery had already named)
        assert (kind, workers) == ("peer", 2) or count == 2, results
        assert {r["ended"] for r in results} <= {85, 86}, results
        return
    assert healthy <= set(finished) | {r for r, v in enumerate(results) if v["ended"] == "shadow"}, results
    timeline = max((r["timeline"] for r in finished.values()), key=len)
    refs = run_ranks(reference, world, workers, timeline, timeout=200)
    for rank, r in finished.items():  # no unverified state commits: the fault-free run's state, bit for bit
        assert refs[rank] is not None and r["digest"] == refs[rank], (rank, r, refs)


@pytest.mark.timeout(300)
def test_recover_a_spare_replaces_the_faulty_worker_and_the_run_equals_a_fault_free_one() -> None:
    _recover("shadow", 3, 1)


RECOVER = [c for c in itertools.product(("peer", "shadow"), (2, 3, 4), (1, 2)) if c != ("shadow", 3, 1)]


@pytest.mark.matrix
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("kind", "workers", "count"), RECOVER)
def test_recover_matrix(kind: str, workers: int, count: int) -> None:
    _recover(kind, workers, count)
