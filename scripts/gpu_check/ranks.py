"""Run a function on N processes joined in one gloo process group, within a deadline, never leaving one behind.

``run_ranks(target, world, *args, timeout=...)`` starts ``world`` processes (``spawn``), each joins a gloo group
through a ``FileStore`` in a fresh temporary folder and returns ``target(rank, world, *args)``; the values come
back in rank order, or :class:`RankFailed` says which rank failed and how (its traceback), or which ranks did not
finish in time. Every rank is killed before it returns. ``target`` must be importable by the children.

Environment the children see: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` as torchrun sets them, one intra-op thread
each (ranks share the machine), and whatever the parent put in ``os.environ`` before the call.
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
from typing import Any

__all__ = ["run_ranks", "RankFailed"]


class RankFailed(RuntimeError):
    """A rank raised, died, or did not finish in time."""


def _child(target: Callable[..., Any], rank: int, world: int, store_path: str, timeout: float, args: tuple[Any, ...],
           results: Any) -> None:
    try:
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=max(10.0, timeout)))
        try:
            value = target(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # everything goes back to the parent, KeyboardInterrupt included
        results.put((rank, False, traceback.format_exc()))


def run_ranks(target: Callable[..., Any], world: int, *args: Any, timeout: float) -> list[Any]:
    """``target(rank, world, *args)`` on ``world`` gloo ranks; their values in rank order."""
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="gpu-check-ranks-")
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(target, r, world, os.path.join(tmp, "store"), timeout, args, results),
                         name=f"rank{r}", daemon=True) for r in range(world)]
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(values) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(values))
                raise RankFailed(f"ranks {missing} did not finish within {timeout:.0f} s")
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = {r: p.exitcode for r, p in enumerate(procs) if r not in values and p.exitcode is not None}
                if dead:
                    try:  # a dying rank's traceback may still be on its way
                        rank, ok, value = results.get(timeout=2.0)
                    except queue.Empty:
                        raise RankFailed(f"ranks died without a result (exit codes {dead})") from None
                else:
                    continue
            if not ok:
                raise RankFailed(f"rank {rank} failed:\n{value}")
            values[rank] = value
        return [values[r] for r in range(world)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        results.close()
        results.cancel_join_thread()
        shutil.rmtree(tmp, ignore_errors=True)
