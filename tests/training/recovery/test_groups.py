"""The verdict of a step across torchft's replica groups (:func:`~sdcguard.training.recovery.groups.judge_groups`):
its rules as properties over any votes, and the cases the torchft jobs meet (a named group, a source whose state went
bad, a refused heal, two witnesses that disagree)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdcguard.training.recovery.groups import VOTE_WIDTH, GroupVote, judge_groups

GOOD, BAD = 11, -7


def _vote(digest: int = GOOD, *, healed: bool = False, corrupt: bool = False, named: bool = False) -> GroupVote:
    return GroupVote(corrupt=corrupt, named=named, healed=healed, step=4, digest=digest, gradients=3)


votes = st.builds(
    GroupVote,
    voted=st.booleans(),
    corrupt=st.booleans(),
    named=st.booleans(),
    healed=st.booleans(),
    step=st.integers(0, 3),
    digest=st.integers(-2, 2),
    gradients=st.integers(0, 1),
)


@given(votes)
def test_a_vote_survives_its_row(v: GroupVote) -> None:
    row = v.row()
    assert len(row) == VOTE_WIDTH and GroupVote.from_row(row) == v


@given(st.lists(votes, min_size=1, max_size=6))
def test_the_rules_hold_for_any_votes(vs: list[GroupVote]) -> None:
    verdict = judge_groups(vs)
    held = [(v.step, v.digest) for v in vs]
    if verdict.commit:  # rule 4: every group voted, no guard vetoed, every group holds the confirmed state
        assert all(v.voted and not v.corrupt and not v.named for v in vs) and verdict.state is not None
        assert all(h == verdict.state for h in held) and not verdict.leavers and not verdict.refused
        assert len({v.gradients for v in vs}) == 1
    newest = max((v.step for v in vs if v.voted), default=0)
    for i, v in enumerate(vs):
        witness = v.voted and not v.healed and v.step == newest
        if i in verdict.leavers:  # rule 2: named by its guard, or a witness with another state than the confirmed
            assert v.voted and (v.named or (witness and verdict.state is not None and held[i] != verdict.state))
        if i in verdict.refused:  # rule 3: a healed group or one behind, for a state the witnesses do not confirm
            assert v.voted and not witness and held[i] != verdict.state
    if verdict.state is not None:  # rule 1: a strict majority of the witnesses holds it; the others do not count
        witnesses = [held[i] for i, v in enumerate(vs) if v.voted and not v.healed and v.step == newest]
        assert 2 * witnesses.count(verdict.state) > len(witnesses)
    assert not (verdict.unresolved and verdict.state is not None)


def test_agreeing_groups_commit() -> None:
    verdict = judge_groups([_vote(), _vote(), _vote()])
    assert verdict.commit and verdict.state == (4, GOOD) and verdict.why == ""


def test_a_corruption_any_guard_found_vetoes_the_step_for_every_group_and_a_named_group_leaves() -> None:
    verdict = judge_groups([_vote(), _vote(corrupt=True, named=True), _vote()])
    assert not verdict.commit and verdict.leavers == (1,) and verdict.why == "a guard found a corruption"
    one_off = judge_groups([_vote(), _vote(corrupt=True), _vote()])  # vetoed, nobody named: nobody leaves
    assert not one_off.commit and one_off.leavers == ()


def test_a_source_whose_state_went_bad_leaves_and_the_group_it_healed_is_refused() -> None:
    # Witnesses 0 and 2 hold the state; 1 served a bad copy of its own bad state to 3, which is no witness.
    verdict = judge_groups([_vote(), _vote(BAD), _vote(), _vote(BAD, healed=True)])
    assert verdict.state == (4, GOOD) and verdict.leavers == (1,) and verdict.refused == (3,)
    assert not verdict.commit


def test_a_healed_group_holding_the_confirmed_state_commits_with_the_others() -> None:
    assert judge_groups([_vote(), _vote(healed=True), _vote()]).commit


def test_two_witnesses_that_disagree_cannot_be_told_apart() -> None:
    verdict = judge_groups([_vote(), _vote(BAD), _vote(GOOD, healed=True)])
    assert verdict.unresolved and verdict.state is None and verdict.leavers == () and verdict.refused == (2,)


def test_a_group_whose_heal_did_not_arrive_is_behind_and_heals_again_instead_of_leaving() -> None:
    behind = GroupVote(corrupt=False, named=False, healed=False, step=1, digest=BAD, gradients=3)
    verdict = judge_groups([_vote(), behind, _vote()])
    assert verdict.state == (4, GOOD) and verdict.leavers == () and verdict.refused == (1,) and not verdict.commit


def test_a_vote_that_did_not_arrive_vetoes_the_step() -> None:
    missing = GroupVote.from_row([0] * VOTE_WIDTH)
    verdict = judge_groups([_vote(), missing, _vote(), _vote()])
    assert not verdict.commit and verdict.why == "a group's vote did not arrive" and verdict.leavers == ()
