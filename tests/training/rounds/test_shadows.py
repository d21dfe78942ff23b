"""Pairing and wire invariants of the replay rounds (pure functions: no process group needed)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdcguard.training.rounds.pairing import peer_source, peer_target, shadow_assignment
from sdcguard.training.rounds.wire import Verdict


@given(st.integers(2, 64), st.integers(0, 10_000))
def test_peer_pairing_is_a_derangement_and_covers_every_pair(world: int, start: int) -> None:
    covered: set[tuple[int, int]] = set()
    for sample in range(start, start + world - 1):
        sources = [peer_source(r, sample, world) for r in range(world)]
        assert sorted(sources) == list(range(world))  # every micro-batch is replayed exactly once
        assert all(s != r for r, s in enumerate(sources))  # never by the rank that computed it
        assert all(peer_target(s, sample, world) == r for r, s in enumerate(sources))
        covered.update((r, s) for r, s in enumerate(sources))
    # over any W-1 consecutive samples every rank has checked every other rank
    assert covered == {(r, s) for r in range(world) for s in range(world) if r != s}


@given(st.integers(1, 16), st.integers(1, 4), st.integers(0, 1000))
def test_shadow_assignment_rotates_over_workers_and_shadows(workers: int, shadows: int, start: int) -> None:
    seen_workers = {shadow_assignment(k, workers, shadows)[0] for k in range(start, start + workers)}
    seen_shadows = {shadow_assignment(k, workers, shadows)[1] for k in range(start, start + shadows)}
    assert seen_workers == set(range(workers)) and seen_shadows == set(range(shadows))


@given(st.integers(0, 2**40), st.integers(-1, 500), st.booleans(), st.booleans(), st.integers(0, 2**40))
def test_verdict_tensor_round_trip(sample: int, first: int, matched: bool, loss: bool, step: int) -> None:
    v = Verdict(sample=sample, step=step, matched=matched, first_unit=None if first < 0 else first, loss_differs=loss)
    assert Verdict.from_tensor(v.to_tensor()) == v
