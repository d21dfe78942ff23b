"""Shared test configuration: the ``gpu`` marker skips (with the reason) where CUDA cannot run."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from sdcguard.testing.postgres import PostgresServer

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


@pytest.fixture(autouse=True)
def _no_drill_left_behind() -> Iterator[None]:
    """An injector made in this process marks it a drill (``$SDCGUARD_DRILL``: its records go to a drill store):
    the mark ends with the test that made it, so the next test's records go where it says."""
    yield
    os.environ.pop("SDCGUARD_DRILL", None)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the whole session (:mod:`sdcguard.testing.postgres`), started the first
    time a test asks. Where none can be started the tests that need one skip, saying why; in CI (``$CI``) they fail
    instead: CI must run them."""
    from sdcguard.testing.postgres import PostgresServer, ServerUnavailable

    try:
        server = PostgresServer()
        server.start()
    except (ServerUnavailable, OSError, ImportError) as e:
        message = f"no PostgreSQL server could be started for the PostgreSQL store tests: {e}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must run them: .ci/run installs the postgresql package)", pytrace=False)
        pytest.skip(message)
    try:
        yield server
    finally:
        server.close()


BACKENDS = ("sqlite", "postgresql")
"""The store's backends, for ``pytest.mark.parametrize("backend", BACKENDS)``."""


@pytest.fixture(scope="session")
def new_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """``new_store(backend)``: a fleet store that does not exist yet, on ``backend``: a SQLite file, or an empty
    schema of the session's PostgreSQL server (its ``postgresql://`` URL). Session-scoped, so property tests may
    make one per example."""

    def make(backend: str) -> str:
        if backend == "sqlite":
            return str(tmp_path_factory.mktemp("store") / "s.db")
        server: PostgresServer = request.getfixturevalue("pg_server")
        return server.fresh_url()

    return make


@pytest.fixture(params=BACKENDS)
def store_db(request: pytest.FixtureRequest, new_store: Callable[[str], str]) -> str:
    """A fleet store that does not exist yet, on each backend in turn (:func:`new_store`)."""
    return new_store(str(request.param))
