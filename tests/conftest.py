"""Shared test configuration: the ``gpu`` marker skips (with the reason) where CUDA cannot run."""

from __future__ import annotations

import functools

import pytest
from hypothesis import settings

# Shared 2-core machines: timing noise must never fail a property test.
settings.register_profile("sdcguard", deadline=None)
settings.load_profile("sdcguard")


@functools.cache
def _cuda_unavailable_reason() -> str | None:
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA install
        return f"cupy not importable: {type(e).__name__}: {e}"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device usable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None if n > 0 else "no CUDA device found"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _cuda_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"gpu test: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_process_group_left_behind() -> object:
    """A test that leaves torch.distributed's default group initialised (Lightning's strategies do) would change
    what the next test in this process sees: close it after each test. Never imports torch itself."""
    yield
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
