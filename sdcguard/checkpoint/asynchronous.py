"""Asynchronous verified checkpoints, on DCP's own ``async_save``: the training loop waits for the copy to host
memory only; the check of that copy and the write happen in the background.

``AsyncCheckpointer.save(state_dict, checkpoint_id=..., guard=...)`` (and ``async_save``, on a default checkpointer
per process group), on the training thread:

1. settles the previous save, waiting for it if it is still writing (at most one save is ever in flight);
2. calls ``torch.distributed.checkpoint.async_save``, which stages the state into host memory and returns. A state
   in host memory is copied into buffers kept across saves by :class:`~.staging.HostStager`, which fingerprints
   every tensor as it copies it (one pass over the state, not two); any other state is fingerprinted on its
   devices (:func:`~.record.fingerprints`) before anything is copied, then staged by a ``DefaultStager`` kept
   across saves (its host buffers reused, pinned when CUDA is there).

In the background, before DCP writes anything, the staged copy is fingerprinted and compared with the device's
fingerprints (a corrupt device-to-host copy is caught), and the ranks exchange their fingerprints and verdicts; a
difference on any rank stops the write on every rank. DCP then writes (a thread, or with ``writer="process"`` DCP's
checkpoint process), and its coordinator writes ``sdcguard.json`` right after DCP's ``.metadata``, saying
*not verified* for now.

Nothing in the background touches the training group: DCP's asynchronous save needs a group with a CPU backend
and issues collectives from its thread, so the checkpointer makes gloo groups of its own over the same ranks
(once, on the training thread, with ``use_local_synchronization``; one group per thread that uses it), and both
DCP's collectives and the exchange of fingerprints run there. The training group may be NCCL alone; a torch
without gloo is refused (:class:`~sdcguard.errors.BadInput`). Ranks agree without a collective of the training
thread: the outcome is known alike on every rank once DCP's write finished (DCP's coordinator reports any rank's
failure to all), and the settling happens at the same point of the program on every rank: the next ``save``,
``wait()``, or ``poll()`` (a small all-reduce on a group of its own).

Settling: the checkpoint is *verified* only when every rank's write finished and ``guard.last_verified_step``
covers its step at that moment; then the guard remembers it (a later incident may name it as the place to roll
back to), the fleet store records it, and the coordinator rewrites the record with ``verified``. A failed write is
reported: a ``RuntimeWarning``, ``CheckpointInfo.error``, and a fleet store row with status ``failed``; it is never
verified and never named as a rollback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from ..errors import BadInput, CheckpointCorrupted
from ..logs import get_logger
from ..training.comm import Comm
from ..training.identity import launcher_job_id
from .dcp import CheckpointInfo
from .layout import METADATA, SIDECAR, describe_failure
from .record import corrupted, file_fingerprint, fingerprints, make_record, write_record
from .staging import HostStager

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    from ..training.guard import SDCGuard

__all__ = ["AsyncCheckpointer", "async_save", "async_wait", "async_poll", "Writer"]

_log = get_logger("checkpoint")

Writer = Literal["thread", "process"]
"""Where DCP writes: a thread of the training process, or DCP's own checkpoint process."""


@dataclass
class _Job:
    """One save, from the training thread to the background and back (pickled to DCP's process with the writer)."""

    path: str
    step: int | None
    guarded: bool
    """Saved with a guard: the record says *not verified* until settled (else: null, nothing vouches)."""
    expected: dict[str, int] = field(default_factory=dict)
    """This rank's fingerprint of every tensor it saves, taken before (or, in host memory, while) it is staged."""
    everyone: list[dict[str, int]] = field(default_factory=list)
    """Every rank's device fingerprints, once the ranks agreed that their staged copies match them."""


class _RecordingWriter(FileSystemWriter):
    """DCP's file writer; its coordinator writes the fingerprint record right after DCP's ``.metadata``."""

    def __init__(self, path: str, job: _Job, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.job = job

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        body = make_record(self.job.everyone, step=self.job.step, verified=False if self.job.guarded else None)
        body["metadata"] = file_fingerprint(Path(self.job.path) / METADATA)
        write_record(Path(self.job.path) / SIDECAR, body)


class _CheckedStager(AsyncStager):
    """On the training thread, fingerprints the state and stages it: a host-memory state with ``host`` (the copy
    and its fingerprints in one pass), any other with ``inner()`` after fingerprinting it on its devices. Then, in
    a thread of its own, fingerprints the staged copy, compares it with the source's fingerprints and agrees with
    the other ranks (on ``group``) before DCP writes."""

    _synchronize_after_execute = False

    def __init__(self, inner: Callable[[], AsyncStager], group: Any, *, owned: bool, host: HostStager | None) -> None:
        self._make_inner = inner
        self._inner: AsyncStager | None = None
        self.group = group
        self.owned = owned
        self.host = host
        self.job: _Job | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sdcguard-staged-check")

    def stage(self, state_dict: Any) -> Future[Any]:
        job = self.job
        assert job is not None
        if self.host is not None and self.host.takes(state_dict):
            staged, job.expected = self.host.stage(state_dict)
        else:
            job.expected = fingerprints(state_dict)  # on each tensor's device, before anything is staged
            if self._inner is None:
                self._inner = self._make_inner()
            staged = self._inner.stage(state_dict)
            if isinstance(staged, Future):  # a caller's asynchronous stager: the state is safe once it is done
                staged = staged.result()
        return self._pool.submit(self._check, staged, job)

    def _check(self, staged: Any, job: _Job) -> Any:
        mine = fingerprints(staged)
        differ = sorted(k for k, v in job.expected.items() if mine.get(k) != v)
        # (expected fingerprints, keys that differ) of each rank
        everyone: list[Any] = (
            [(job.expected, differ)] if self.group is None else Comm(self.group).gather_objects((job.expected, differ))
        )
        bad: dict[str, list[int]] = {}
        for rank, (_, keys) in enumerate(everyone):
            for k in keys:
                bad.setdefault(k, []).append(rank)
        if bad:  # every rank raises alike: nobody writes
            raise CheckpointCorrupted(
                str(corrupted(f"the host copy staged for {job.path}", bad)), keys=tuple(sorted(bad))
            )
        job.everyone = [fps for fps, _ in everyone]
        return staged

    def synchronize_staging(self) -> None:
        """Nothing to wait for: DCP waits on the future :meth:`stage` returns (``_synchronize_after_execute`` is
        False, so DCP never calls this)."""
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.host is not None:
            self.host.close()
        if self.owned and self._inner is not None:  # a caller's stager stays the caller's to close (DCP's convention)
            self._inner.close()


@dataclass
class _InFlight:
    job: _Job
    response: Any
    upload: Future[Any]
    guard: SDCGuard | None
    store: str | None


class AsyncCheckpointer:
    """Asynchronous verified saves for one process group (see the module docstring); at most one in flight.

    ``process_group``: the ranks that save (default: the world); the checkpointer's own gloo groups span the same
    ranks. ``writer``: ``"thread"`` or ``"process"`` (DCP's checkpoint process). ``stager``: how the state is copied
    to host memory (default: DCP's ``DefaultStager``, kept across saves so its host buffers are reused: it holds one
    host copy of the state between saves; ``cache_staging=False`` stages into fresh memory each time). A public
    seam: a test may pass a stager that damages the copy.
    """

    def __init__(
        self,
        *,
        process_group: Any = None,
        writer: Writer = "thread",
        stager: AsyncStager | None = None,
        cache_staging: bool = True,
    ) -> None:
        if writer not in ("thread", "process"):
            raise BadInput(f"writer must be 'thread' or 'process', not {writer!r}")
        self.process_group = process_group
        self.writer: Writer = writer
        self._given_stager = stager
        self._cache = cache_staging
        self._stager: _CheckedStager | None = None
        self._groups: tuple[Any, Any, Any] | None = None
        self._inflight: _InFlight | None = None
        self.settled: list[CheckpointInfo] = []
        """Every settled save, oldest first (identical on every rank)."""

    # ------------------------------------------------------------------------------------------ set-up

    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def _own_groups(self) -> tuple[Any, Any, Any]:
        """(DCP's group, the staged-copy check's group, the settling group): gloo groups of their own over the
        saving ranks, one per thread that issues collectives on it (two threads on one group could interleave
        their collectives differently on different ranks: DCP's checkpoint process is set up on the training
        thread while the check runs)."""
        if self._groups is None:
            if not self._distributed():
                self._groups = (None, None, None)
            else:
                if not dist.is_gloo_available():
                    raise BadInput(
                        "async_save needs a CPU backend (gloo) for DCP's background save and this torch "
                        "has none: initialize with a gloo-capable build, e.g. backend 'cpu:gloo,cuda:nccl'"
                    )
                ranks = dist.get_process_group_ranks(self.process_group or dist.group.WORLD)
                self._groups = tuple(
                    dist.new_group(ranks, backend="gloo", use_local_synchronization=True) for _ in range(3)
                )
        return self._groups

    def _checked_stager(self, group: Any) -> _CheckedStager:
        if self._stager is None or not self._cache:
            if self._stager is not None:
                self._stager.close()
            given = self._given_stager
            shared = self.writer == "process"

            def inner() -> AsyncStager:
                return given or DefaultStager(
                    StagingOptions(
                        use_pinned_memory=torch.cuda.is_available(),
                        use_shared_memory=shared,
                        use_async_staging=False,
                        use_non_blocking_copy=False,
                    )
                )

            host = None if given is not None else HostStager(shared=shared, cache=self._cache)
            self._stager = _CheckedStager(inner, group, owned=given is None, host=host)
        return self._stager

    # ------------------------------------------------------------------------------------------ saving

    def save(
        self,
        state_dict: dict[str, Any],
        *,
        checkpoint_id: str | os.PathLike[str],
        guard: SDCGuard | None = None,
        step: int | None = None,
        overwrite: bool = False,
        store: str | os.PathLike[str] | None = None,
        planner: Any = None,
    ) -> AsyncSaveResponse:
        """Start saving ``state_dict`` (collective: every saving rank calls it, in the same order).

        Returns what DCP's ``async_save`` returns with a staging future: an ``AsyncSaveResponse`` whose
        ``staging_completion`` is done when the host copy was checked against the device's fingerprints on every
        rank, and ``upload_completion`` when DCP's write (and the record) finished; its exception says why a save
        failed. The state may be changed as soon as this returns. ``step`` defaults to the last step the guard saw;
        ``store`` (default: the guard's) is the fleet store the outcome is recorded in.
        """
        path = Path(os.fspath(checkpoint_id)) if str(checkpoint_id).strip() else None
        if path is None:
            raise BadInput("checkpoint_id is required: the directory the checkpoint lives in")
        self.wait()  # at most one in flight: settle the previous save first
        if (path / METADATA).exists() and not overwrite:
            raise BadInput(f"{path} already holds a checkpoint; pass overwrite=True to replace it")
        if guard is not None and step is None:
            step = guard.state_dict()["last_step"]
        background, check, _ = self._own_groups()
        if overwrite and self._rank() == 0:  # the old record must not vouch for the new files while they land
            (path / SIDECAR).unlink(missing_ok=True)
        job = _Job(path=str(path), step=step, guarded=guard is not None)  # the stager fills in the fingerprints
        stager = self._checked_stager(check)
        stager.job = job
        kind = AsyncCheckpointerType.PROCESS if self.writer == "process" else AsyncCheckpointerType.THREAD
        # An AsyncSaveResponse, as the stager's stage() returns a future (a torch without it: the upload future).
        response: Any = dcp.async_save(
            state_dict,
            storage_writer=_RecordingWriter(str(path), job),
            planner=planner,
            process_group=background,
            no_dist=background is None,
            async_checkpointer_type=kind,
            async_stager=stager,
        )
        upload = response.upload_completion if hasattr(response, "upload_completion") else response
        store_path = os.fspath(store) if store is not None else (guard.config.store if guard is not None else None)
        self._inflight = _InFlight(job=job, response=response, upload=upload, guard=guard, store=store_path)
        return response

    @property
    def in_flight(self) -> bool:
        """Whether a save has not been settled yet."""
        return self._inflight is not None

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight (if any) and settle it: the same on every rank (no collective)."""
        current, self._inflight = self._inflight, None
        if current is None:
            return None
        return self._settle(current)

    def poll(self) -> CheckpointInfo | None:
        """Settle the save in flight if every rank's write has finished (collective on the checkpointer's own
        group: every saving rank calls it at the same point, e.g. after each optimizer step); None otherwise."""
        current = self._inflight
        _, _, settling = self._own_groups()
        done = current is not None and current.upload.done()
        if settling is not None:
            done = Comm(settling).all_true(done)
        return self.wait() if done else None

    def close(self) -> CheckpointInfo | None:
        """Settle the last save and release the staging buffers (end of training)."""
        info = self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        return info

    # ------------------------------------------------------------------------------------------ settling

    def _settle(self, current: _InFlight) -> CheckpointInfo:
        job, guard = current.job, current.guard
        error: str | None = None
        try:
            current.upload.result()
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            error = describe_failure(e)
        writer_rank = self._rank() == 0
        if error is not None:
            info = CheckpointInfo(
                checkpoint_id=job.path,
                step=job.step,
                verified=False if guard else None,
                digest="",
                tensors=len(job.expected),
                saved=False,
                error=error,
            )
            _log.warning("the asynchronous save of %s failed (%s); it is not verified", job.path, error)
            if current.store is not None and writer_rank:
                self._store_write(
                    current.store, job, self._job_id(guard), status="failed", verified=False, digest="", detail=error
                )
        else:
            body = make_record(job.everyone, step=job.step, verified=None)
            verified: bool | None = None
            if guard is not None and job.step is not None:
                verified = guard.record_checkpoint(job.path, job.step, body["digest"])  # also the store's record
            elif current.store is not None and writer_rank and job.step is not None:
                self._store_write(
                    current.store,
                    job,
                    self._job_id(None),
                    status="saved",
                    verified=False,
                    digest=body["digest"],
                    detail="",
                )
            if writer_rank and verified:
                body["verified"] = True
                body["metadata"] = file_fingerprint(Path(job.path) / METADATA)
                write_record(Path(job.path) / SIDECAR, body)
            info = CheckpointInfo(
                checkpoint_id=job.path,
                step=job.step,
                verified=verified,
                digest=body["digest"],
                tensors=len(job.expected),
            )
        self.settled.append(info)
        return info

    def _rank(self) -> int:
        background = self._groups[0] if self._groups is not None else None
        return dist.get_rank(background) if background is not None else 0

    @staticmethod
    def _job_id(guard: SDCGuard | None) -> str | None:
        """The job's id as the guard records it (its rows and this one then list together), else the launcher's
        (the guard's rule: :func:`~sdcguard.training.identity.launcher_job_id`)."""
        if guard is not None:
            return guard.job
        return launcher_job_id()

    def _store_write(self, store: str, job: _Job, job_id: str | None, **row: Any) -> None:
        try:
            from ..fleet.store.spool import open_writer

            with open_writer(store) as db:  # a server's outage: its spool (never blocks past the timeout)
                db.training.record_checkpoint(
                    checkpoint_id=job.path, step=job.step if job.step is not None else -1, job=job_id, **row
                )
        except Exception as e:  # never crash training over bookkeeping
            _log.warning("could not record checkpoint %s in %s: %s", job.path, store, e)


_DEFAULT: dict[int, AsyncCheckpointer] = {}


def _default(process_group: Any) -> AsyncCheckpointer:
    key = id(process_group)
    if key not in _DEFAULT:
        _DEFAULT[key] = AsyncCheckpointer(process_group=process_group)
    return _DEFAULT[key]


def async_save(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | os.PathLike[str],
    guard: SDCGuard | None = None,
    process_group: Any = None,
    **kwargs: Any,
) -> AsyncSaveResponse:
    """:meth:`AsyncCheckpointer.save` on the default checkpointer of ``process_group`` (thread writer, cached
    staging); the previous save settles at the next call, ``async_poll()`` or ``async_wait()``."""
    return _default(process_group).save(state_dict, checkpoint_id=checkpoint_id, guard=guard, **kwargs)


def async_wait(process_group: Any = None) -> CheckpointInfo | None:
    """Wait for and settle the default checkpointer's save in flight (call it before the process ends)."""
    return _default(process_group).wait()


def async_poll(process_group: Any = None) -> CheckpointInfo | None:
    """Settle the default checkpointer's save if every rank's write finished (collective; see ``poll``)."""
    return _default(process_group).poll()
