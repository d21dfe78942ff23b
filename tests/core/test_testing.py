"""The distributed harness itself: results come back in rank order, failures and hangs end the test."""

from __future__ import annotations

import time

import pytest

from sdcguard.testing import GROUP_NOT_FORMED, RankFailed, run_ranks
from sdcguard.testing import ranks as local_ranks

pytestmark = pytest.mark.distributed


def _allreduce_rank(rank: int, world_size: int, base: int) -> tuple[int, int]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + base])
    dist.all_reduce(t)
    return rank, int(t.item())


def _fail_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one is broken")
    return rank


def _hang_on_rank_zero(rank: int, world_size: int) -> int:
    if rank == 0:
        time.sleep(600)
    return rank


def test_values_come_back_in_rank_order() -> None:
    out = run_ranks(_allreduce_rank, 3, 10, timeout=120)
    assert out == [(0, 33), (1, 33), (2, 33)]


def test_a_failing_rank_raises_with_its_traceback() -> None:
    with pytest.raises(RankFailed, match="rank one is broken"):
        run_ranks(_fail_on_rank_one, 2, timeout=120)


@pytest.mark.slow
def test_a_hanging_rank_is_killed_at_the_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="timeout"):
        run_ranks(_hang_on_rank_zero, 2, timeout=10)
    assert time.monotonic() - t0 < 45


def test_a_group_that_did_not_form_is_started_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    real = local_ranks.run_ranks_once
    fail_next = [True]

    def flaky(fn, world, *args, timeout, **settings):
        calls.append(timeout)
        if fail_next.pop() if fail_next else False:
            raise RankFailed(f"rank 0 failed:\n{GROUP_NOT_FORMED}RuntimeError: Gloo connectFullMesh failed")
        return real(fn, world, *args, timeout=timeout, **settings)

    monkeypatch.setattr(local_ranks, "run_ranks_once", flaky)
    assert run_ranks(_allreduce_rank, 2, 1, timeout=120) == [(0, 3), (1, 3)]
    assert len(calls) == 2 and calls[1] <= 120
    calls.clear()
    with pytest.raises(RankFailed, match="rank one is broken"):  # a failure inside fn is not retried
        run_ranks(_fail_on_rank_one, 2, timeout=120)
    assert len(calls) == 1
