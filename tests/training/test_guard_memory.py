"""The guard keeps no copy of the gradients (issue: checks that cost no gradient copies).

Peak memory growth of three training steps, in fresh 2-rank gloo jobs (``benchmarks/guard_memory.py``), as a ratio
to the model's parameter bytes: the every-step checks add at most 0.1x over plain DDP, and a peer replay on every
step adds at most its activations plus the one gradient it computes at a time (the largest parameter's) plus 0.1x.
The guard this replaced kept two copies of the gradients for the checks and three with a replay.
"""

from __future__ import annotations

import pytest

from benchmarks.guard_memory import measure

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LAYERS, WIDTH = 12, 1024  # 12.6M parameters (50 MB); the largest parameter is a twelfth of them


@pytest.mark.timeout(280)
def test_checks_and_peer_replay_keep_no_gradient_copies() -> None:
    growth = {}
    for config in ("ddp", "checks", "peer"):
        ranks = measure(config, layers=LAYERS, width=WIDTH, batch=8, steps=3)
        growth[config] = max(r["growth"] for r in ranks)
        param_bytes, activations = ranks[0]["param_bytes"], ranks[0]["activations"]
    largest = WIDTH * WIDTH * 4
    assert growth["ddp"] > param_bytes  # the baseline's own gradients are there: the measurement sees memory
    assert growth["checks"] - growth["ddp"] <= 0.1 * param_bytes, growth
    assert growth["peer"] - growth["ddp"] <= activations + largest + 0.1 * param_bytes, growth
