"""Pairing and wire invariants of the shadow modes (pure functions: no process group needed)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.replay import Digest
from sdcguard.shadows import (
    Verdict,
    digest_hash,
    flatten_params,
    peer_source,
    peer_target,
    shadow_assignment,
    unflatten_params,
)


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


@given(st.lists(st.tuples(st.integers(1, 5), st.sampled_from([torch.float32, torch.float16, torch.int64])),
                min_size=1, max_size=8))
def test_flatten_unflatten_round_trip(specs: list[tuple[int, torch.dtype]]) -> None:
    params = [torch.arange(n).to(dtype).reshape(n, 1) + i for i, (n, dtype) in enumerate(specs)]
    flats, layout = flatten_params(params)
    assert [n for _, n in layout] == [f.numel() for f in flats]
    back = unflatten_params(flats, params)
    assert all(torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape for a, b in zip(params, back))


@given(st.integers(0, 2**40), st.integers(-1, 500), st.booleans(), st.booleans(), st.integers(0, 2**62),
       st.integers(0, 2**40))
def test_verdict_tensor_round_trip(sample: int, first: int, matched: bool, loss: bool, h: int, step: int) -> None:
    v = Verdict(sample=sample, step=step, matched=matched, first_index=None if first < 0 else first,
                loss_differs=loss, shadow_hash=h)
    assert Verdict.from_tensor(v.to_tensor()) == v


@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), max_size=5))
def test_digest_hash_fits_the_verdict_and_ignores_per_parameter_detail(loss: int, buckets: list[int]) -> None:
    d = Digest(loss=loss, buckets=tuple(buckets))
    h = digest_hash(d)
    assert 0 <= h < 2**63 and h == digest_hash(Digest(loss=loss, buckets=tuple(buckets), params=(1, 2)))
    assert d == Digest(loss=loss, buckets=tuple(buckets), params=(3,))
