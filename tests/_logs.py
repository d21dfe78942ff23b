"""What the ``sdcguard`` logger said inside a block, in any process (a rank of a distributed test included)."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

__all__ = ["logged", "expect_log"]


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextlib.contextmanager
def logged(level: int = logging.WARNING) -> Iterator[list[str]]:
    """The messages (``[sdcguard rank R step S] ...``) logged under ``sdcguard`` at ``level`` or above."""
    messages: list[str] = []
    handler = _Collect(messages)
    handler.setLevel(level)
    logger = logging.getLogger("sdcguard")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


@contextlib.contextmanager
def expect_log(pattern: str, level: int = logging.WARNING) -> Iterator[list[str]]:
    """Like ``pytest.warns(match=...)`` for the logger: some line logged inside the block matches ``pattern``."""
    with logged(level) as messages:
        yield messages
    assert any(re.search(pattern, m) for m in messages), f"no sdcguard log line matches {pattern!r}: {messages}"
