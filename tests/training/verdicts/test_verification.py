"""What the guard's checks vouch for, and where to roll back to (pure bookkeeping, no processes)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdcguard.training.verdicts.verification import Verification


def test_nothing_is_verified_until_every_rank_was_sampled_cleanly() -> None:
    v = Verification([0, 1, 2])
    assert v.last_verified_step is None
    v.sampled(10, {0, 1})
    assert v.last_verified_step is None
    v.sampled(10, {2})
    assert v.last_verified_step == 10
    v.sampled(20, {0, 1, 2})
    assert v.last_verified_step == 20


def test_dedicated_shadows_verify_one_rank_at_a_time() -> None:
    v = Verification([0, 1, 2])
    for step, rank in ((3, 0), (6, 1), (9, 2), (12, 0)):
        v.sampled(step, {rank})
    assert v.last_verified_step == 6  # rank 1's latest clean sample: every rank was checked at or after 6


def test_a_fault_between_samples_rolls_back_before_the_previous_clean_sample() -> None:
    """A sticky fault starts at step 60 on rank 1 and is found at the sample of step 100: steps 51..100 may hold it
    (the rank's previous clean sample was step 50), so the restart is from the checkpoint at step 50."""
    v = Verification([0, 1, 2])
    for step in (0, 50):
        v.sampled(step, {0, 1, 2})
    for ckpt, step in (("c0", 0), ("c40", 40), ("c50", 50), ("c75", 75)):
        v.note_checkpoint(ckpt, step)
    assert [c.verified for c in v.checkpoints] == [True, True, True, False]
    earliest = v.earliest_touched(1, 100)
    assert earliest == 51
    v.taint(earliest)
    assert v.rollback(earliest).checkpoint_id == "c50"
    v.sampled(150, {0, 1, 2})  # later clean samples cannot vouch for weights that may already hold the fault
    assert v.last_verified_step == 50
    assert not v.note_checkpoint("c150", 150).verified


def test_diverged_weights_taint_from_the_last_comparison_that_agreed() -> None:
    v = Verification([0, 1])
    v.sampled(10, {0, 1})
    v.note_checkpoint("c10", 10)
    v.weights_compared(10, agreed=True)
    v.sampled(20, {0, 1})
    v.weights_compared(20, agreed=False)
    assert v.tainted_from == 11 and v.last_verified_step == 10 and v.rollback(11).checkpoint_id == "c10"


@given(
    st.lists(st.tuples(st.integers(0, 200), st.sets(st.integers(0, 3), max_size=4)), max_size=30), st.integers(0, 200)
)
def test_the_verified_step_never_lies_after_a_taint(samples: list[tuple[int, set[int]]], taint: int) -> None:
    v = Verification([0, 1, 2, 3])
    for step, ranks in sorted(samples, key=lambda s: s[0]):
        v.sampled(step, ranks)
    v.taint(taint)
    last = v.last_verified_step
    assert last is None or last < taint
    state = v.state_dict()
    w = Verification([0, 1, 2, 3])
    w.load_state_dict(state)
    assert w.last_verified_step == last or len({s for s, _ in samples}) > 64
