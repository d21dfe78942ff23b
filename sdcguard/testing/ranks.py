"""Run a function on N local processes joined in one gloo process group, within a deadline, never leaving one behind.

``run_ranks(fn, world_size, *args, timeout=...)`` starts ``world_size`` processes, each forked from a fork server
that imported torch and the guard once (never forked from the caller, whose torch may have started threads;
``start_method="spawn"`` starts each afresh, for a measurement of a process's own memory). Each joins a gloo process
group through a ``FileStore`` in a fresh temporary directory, runs ``fn(rank, world_size, *args)`` and sends back its
(picklable) return value. It returns the values in rank order, or raises :class:`RankFailed` if any rank fails (with
that rank's traceback), dies, or the timeout passes; in every case all ranks are killed before it returns, so a
caller (a test, the GPU check, a benchmark) can never leave processes behind or hang.

``backend="nccl"`` joins an NCCL group instead, each rank on ``cuda:<rank>`` (NCCL refuses two ranks on one device:
the GPU check runs its FSDP2 paths on CUDA as one NCCL rank). The children see ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` as torchrun sets them, one intra-op thread each (the ranks share the machine's cores) and whatever
the parent put in ``os.environ`` before the call. ``fn`` must be importable by the children: define it at module
level.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["run_ranks", "run_ranks_once", "RankFailed", "GROUP_NOT_FORMED"]

GROUP_NOT_FORMED = "the process group did not form: "
"""How a :class:`RankFailed` message begins when a rank could not join the process group (then ``run_ranks`` starts
the ranks afresh once)."""


StartMethod = Literal["forkserver", "spawn"]

_PRELOAD = ["torch", "torch.distributed", "sdcguard.training"]
"""What the fork server imports once, so that a rank starts without importing torch again (a second or more of
CPU per rank, most of a small test's time on a 2-core machine)."""


class RankFailed(RuntimeError):
    """A rank raised, died, or did not finish in time."""


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    store_path: str,
    timeout: float,
    args: tuple[Any, ...],
    results: Any,
    backend: str,
    environ: dict[str, str],
) -> None:
    try:
        os.environ.clear()  # the parent's environment now, not the fork server's from its start
        os.environ.update(environ)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
        import torch
        import torch.distributed as dist

        # Several ranks share few cores: one intra-op thread each avoids oversubscription stalls.
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world_size)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        try:
            dist.init_process_group(
                backend,
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=max(5.0, timeout)),
            )
        except Exception:
            results.put((rank, False, GROUP_NOT_FORMED + traceback.format_exc()))
            return
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # report everything, including KeyboardInterrupt/SystemExit, to the parent
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    backend: str = "gloo",
    start_method: StartMethod = "forkserver",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return their values in rank order.

    A process group that fails to form (gloo's TCP mesh, seen once in hundreds of runs on a loaded machine: a peer's
    connection closed during ``connectFullMesh``) is started afresh once; a failure inside ``fn`` never is."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    start = time.monotonic()
    try:
        return run_ranks_once(fn, world_size, *args, timeout=timeout, backend=backend, start_method=start_method)
    except RankFailed as e:
        left = timeout - (time.monotonic() - start)
        if GROUP_NOT_FORMED not in str(e) or left < 5.0:
            raise
        return run_ranks_once(fn, world_size, *args, timeout=left, backend=backend, start_method=start_method)


def run_ranks_once(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float,
    backend: str = "gloo",
    start_method: StartMethod = "forkserver",
) -> list[Any]:
    """One attempt of :func:`run_ranks`: no second start when the process group does not form."""
    ctx = mp.get_context("forkserver") if start_method == "forkserver" else mp.get_context("spawn")
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    tmp = tempfile.mkdtemp(prefix="sdcguard-ranks-")
    store_path = os.path.join(tmp, "store")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, r, world_size, store_path, timeout, args, results, backend, dict(os.environ)),
            name=f"rank{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(values) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(values))
                raise RankFailed(f"timeout after {timeout:.0f}s: ranks {missing} did not finish")
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = {r: p.exitcode for r, p in enumerate(procs) if r not in values and p.exitcode is not None}
                if not dead:
                    continue
                try:  # give a dying rank's queued traceback a moment to arrive before blaming the exit code
                    rank, ok, value = results.get(timeout=2.0)
                except queue.Empty:
                    raise RankFailed(f"ranks died without a result (exit codes {dead})") from None
            if not ok:
                raise RankFailed(f"rank {rank} failed:\n{value}")
            values[rank] = value
        return [values[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        results.close()
        results.cancel_join_thread()
        shutil.rmtree(tmp, ignore_errors=True)
