"""What every golden-suite backend shares: the output hook type, the packaged suite, and the suite/lifetime
plumbing of a backend (numpy per CPU core, CuPy per GPU)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Self

import numpy as np

from .suite import Suite, load_suite

__all__ = ["OutputHook", "default_suite", "BackendBase", "slow_factor"]

OutputHook = Callable[[str, np.ndarray], np.ndarray]
"""``hook(case_id, output) -> output``: applied before the comparison (the fire-drill injection point). A hook may
also have ``slowdown(case_id) -> float``: how many times as long the case must take (the slow drill)."""


def slow_factor(hook: object, case_id: str) -> float:
    """How many times as long ``case_id`` must take under ``hook`` (an output hook; 1.0 for none or no slow rule)."""
    factor = getattr(hook, "slowdown", None)
    return float(factor(case_id)) if callable(factor) else 1.0


@functools.cache
def default_suite() -> Suite:
    """The suite from the packaged ``golden_vectors/`` (loaded and checked once per process)."""
    return load_suite()


class BackendBase:
    """The suite a backend runs (the packaged one unless given) and ``with backend: ...`` closing it."""

    _suite: Suite | None = None

    @property
    def suite(self) -> Suite:
        if self._suite is None:
            self._suite = default_suite()
        return self._suite

    def close(self) -> None:
        """Release what the backend holds; subclasses say what."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
