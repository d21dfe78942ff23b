"""A launcher sets the guard's periods without code changes (``sdcguard plan --format env``): a period the code
leaves unset comes from ``$SDCGUARD_REPLAY_EVERY`` / ``$SDCGUARD_CHECKSUM_EVERY``; one the code gives wins; a
malformed value is refused in one line."""

from __future__ import annotations

import pytest

from sdcguard import SDCGuard
from sdcguard.errors import BadInput
from sdcguard.testing.models import TinyTransformer, lm_loss
from sdcguard.training.config import DEFAULT_CHECKSUM_EVERY, DEFAULT_REPLAY_EVERY, GuardConfig


def test_unset_periods_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SDCGUARD_REPLAY_EVERY", raising=False)
    monkeypatch.delenv("SDCGUARD_CHECKSUM_EVERY", raising=False)
    config = GuardConfig.of(replay_every=None, checksum_every=None)
    assert (config.replay_every, config.checksum_every) == (DEFAULT_REPLAY_EVERY, DEFAULT_CHECKSUM_EVERY)
    monkeypatch.setenv("SDCGUARD_REPLAY_EVERY", "17")
    monkeypatch.setenv("SDCGUARD_CHECKSUM_EVERY", "0")
    guard = SDCGuard(TinyTransformer(), lm_loss)
    assert (guard.config.replay_every, guard.config.checksum_every) == (17, 0)
    guard.close()
    config = GuardConfig.of(replay_every=5, checksum_every=2)  # the code's own values win
    assert (config.replay_every, config.checksum_every) == (5, 2)


@pytest.mark.parametrize("value", ["-1", "ten", "2.5"])
def test_a_malformed_period_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SDCGUARD_REPLAY_EVERY", value)
    with pytest.raises(BadInput, match=r"\$SDCGUARD_REPLAY_EVERY=.*integer >= 0"):
        GuardConfig.of(replay_every=None, checksum_every=None)
