"""What :class:`~.store.Store`'s parts not yet moved to a job of their own build on: the store's core
(:class:`~.core.StoreCore`) under the names those parts use. It goes once every job is composed over the core."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, Self

from .core import BUSY_TIMEOUT_S, StoreCore, open_backend
from .counts import Counts
from .failures import Failures
from .quarantine import Quarantine
from .scans import Scans
from .summaries import Summaries
from .training import Training

__all__ = ["StoreBase"]


class StoreBase:
    """The connection, its opening and its transactions. One belongs to one thread: open one per process."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self._backend = core.backend
        self._conn = core.backend.conn
        self.path: str | Path = core.path
        """The store's file, or (a server) its URL without credentials: what messages name."""
        self.counts = Counts(core)
        """Counts over a window (:class:`~.counts.Counts`)."""
        self.failures = Failures(core)
        """Failed executions and what the breaker weighs beside them (:class:`~.failures.Failures`)."""
        self.scans = Scans(core)
        """Devices, scans and their results (:class:`~.scans.Scans`)."""
        self.training = Training(core)
        """Incidents, checkpoints and scrubs (:class:`~.training.Training`)."""
        self.quarantine = Quarantine(core, failures=self.failures, training=self.training)
        """Quarantine, probation, the policy's decisions and actions, devices' statuses
        (:class:`~.quarantine.Quarantine`)."""
        self.summaries = Summaries(core)
        """Kept summaries and the devices' versions (:class:`~.summaries.Summaries`)."""

    @property
    def backend(self) -> Literal["sqlite", "postgresql"]:
        """Which database holds this store: a SQLite file or a PostgreSQL server."""
        return self._core.kind

    @property
    def read_only_reason(self) -> str | None:
        """Why this store was opened read-only (None: opened for writing)."""
        return self._backend.read_only_reason

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        timeout_s: float = BUSY_TIMEOUT_S,
        readonly: bool = False,
        answer_within_s: float | None = None,
    ) -> Self:
        """Open (and with ``create``, create or migrate) the store at ``path``: a SQLite file, or a PostgreSQL
        server's ``postgresql://`` URL (:mod:`.postgres`; credentials come from libpq's environment or service
        file, never from the URL).

        ``readonly``: the caller only reads. A store this process may write is opened as usual (an older one is
        migrated); one it may not (a read-only file or directory) is opened read-only (:func:`read_only_uri`).
        Without ``readonly``, a store this process may not write is refused with one line saying so.

        Raises :class:`StoreError` (not SQLite, unreadable, read-only for a writer, missing directory, missing
        file without ``create``; a server that cannot be reached: :class:`~sdcguard.errors.StoreUnreachable`) or
        :class:`SchemaTooNew`; in every such case the store is left untouched. An older store is migrated forward
        in one transaction.

        ``timeout_s``: how long to wait for a lock (SQLite's busy timeout) or to connect (a server).
        ``answer_within_s``: a server's statements that take longer are cancelled
        (:class:`~sdcguard.errors.StoreUnreachable`): what a writer with a spool waits at most.
        """
        return cls(
            StoreCore(
                open_backend(
                    path, create=create, timeout_s=timeout_s, readonly=readonly, answer_within_s=answer_within_s
                )
            )
        )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._core.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> AbstractContextManager[Any]:
        return self._core.write()

    def _lock_devices(self, devices: Iterable[str], *, changed: bool = True) -> None:
        self._core.lock_devices(devices, changed=changed)

    def _rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        return self._core.rows(sql, params)

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return self._core.dicts(sql, params)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._core.one(sql, params)

    def _meta(self, key: str) -> str | None:
        return self._core.meta(key)

    @property
    def store_id(self) -> str:
        """This store's identity (a uuid made when it was created): merges remember their inputs by it."""
        value = self._meta("store_id")
        assert value is not None, "every schema-4 store has a store_id"
        return value

    @property
    def pruned_before(self) -> float | None:
        """The retention horizon (None: never pruned)."""
        return self._core.pruned_before
