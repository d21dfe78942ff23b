"""The fleet store: devices, scans, results, incidents, checkpoints and the quarantine, in one SQLite file (WAL) or
on a PostgreSQL server, reached through the jobs it does.

A :class:`Store` is its jobs, each one object holding its reads and writes together, composed over one
:class:`~.core.StoreCore` (the backend, its transactions, the device lock that moves versions):

- ``store.scans`` (:class:`~.scans.Scans`): devices, scans and their results, as a scanner records them;
- ``store.failures`` (:class:`~.failures.Failures`): failed executions and what the circuit breaker weighs;
- ``store.counts`` (:class:`~.counts.Counts`): counts over a window (rates, scans, slowness inputs, series);
- ``store.quarantine`` (:class:`~.quarantine.Quarantine`): quarantine, probation, the policy's decisions and
  actions, devices' statuses;
- ``store.training`` (:class:`~.training.Training`): incidents, checkpoints and scrubs;
- ``store.summaries`` (:class:`~.summaries.Summaries`): kept summaries and devices' versions;
- ``store.maintenance`` (:class:`~.maintenance.Maintenance`): merge, prune, vacuum, roles, a spool's mark;
- ``store.diagnostics`` and ``store.hardware`` (:mod:`.diagnostics`): the hardware's own opinions of itself, DCGM's
  diagnostics and NVML's readings around each scan.

Nothing outside the store writes SQL: everything else asks a job by name and gets records (:mod:`.rows`). A caller
takes the job it uses. A server store's writers and their spool offer the writers' jobs the same way
(:mod:`.spool`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from .core import BUSY_TIMEOUT_S, StoreCore, open_backend
from .counts import Counts
from .diagnostics import Diagnostics, Hardware
from .failures import Failures
from .maintenance import Maintenance
from .quarantine import Quarantine
from .scans import Scans
from .summaries import Summaries
from .training import Training

__all__ = ["Store"]


class Store:
    """The fleet store: its jobs over one connection. Open with :meth:`Store.open`; use as a context manager or
    call :meth:`close`. One ``Store`` belongs to one thread (SQLite connections are not shared); open one per
    process or thread.

    Args:
        core: the opened store's core (:meth:`open` makes it).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        self.path: str | Path = core.path
        """The store's file, or (a server) its URL without credentials: what messages name."""
        self.backend: Literal["sqlite", "postgresql"] = core.kind
        """Which database holds this store: a SQLite file or a PostgreSQL server."""
        self.read_only_reason: str | None = core.backend.read_only_reason
        """Why this store was opened read-only (None: opened for writing)."""
        self.scans = Scans(core)
        """Devices, scans and their results."""
        self.failures = Failures(core)
        """Failed executions and what the circuit breaker weighs beside them."""
        self.counts = Counts(core)
        """Counts over a window."""
        self.training = Training(core)
        """Incidents, checkpoints and scrubs."""
        self.quarantine = Quarantine(core, failures=self.failures, training=self.training)
        """Quarantine, probation, the policy's decisions and actions, devices' statuses."""
        self.summaries = Summaries(core)
        """Kept summaries and devices' versions."""
        self.maintenance = Maintenance(core)
        """Merge, prune, vacuum, roles, a spool's mark; the store's identity and retention horizon."""
        self.diagnostics = Diagnostics(core)
        """DCGM's diagnostics per GPU, a second opinion beside the golden suite's results."""
        self.hardware = Hardware(core)
        """NVML's readings of each GPU around its scans (XIDs, ECC counts, remapped rows), another second opinion."""

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        timeout_s: float = BUSY_TIMEOUT_S,
        readonly: bool = False,
        answer_within_s: float | None = None,
    ) -> Store:
        """Open (and with ``create``, create or migrate) the store at ``path``: a SQLite file, or a PostgreSQL
        server's ``postgresql://`` URL (:mod:`.postgres`; credentials come from libpq's environment or service
        file, never from the URL).

        ``readonly``: the caller only reads. A store this process may write is opened as usual (an older one is
        migrated); one it may not (a read-only file or directory) is opened read-only
        (:func:`~.sqlite.files.read_only_uri`). Without ``readonly``, a store this process may not write is
        refused with one line saying so.

        Raises :class:`~sdcguard.errors.StoreError` (not SQLite, unreadable, read-only for a writer, missing
        directory, missing file without ``create``; a server that cannot be reached:
        :class:`~sdcguard.errors.StoreUnreachable`) or :class:`~sdcguard.errors.SchemaTooNew`; in every such case the
        store is left untouched. An older store is migrated forward in one transaction.

        ``timeout_s``: how long to wait for a lock (SQLite's busy timeout) or to connect (a server).
        ``answer_within_s``: a server's statements that take longer are cancelled
        (:class:`~sdcguard.errors.StoreUnreachable`): what a writer with a spool waits at most.
        """
        backend = open_backend(
            path, create=create, timeout_s=timeout_s, readonly=readonly, answer_within_s=answer_within_s
        )
        return cls(StoreCore(backend))

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._core.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
