"""Never take a device from a job: idle detection and a lock per device.

A GPU is idle when no compute process runs on it and its utilization stayed under a threshold (default 5%) over
a short window (default 1 s, sampled every 100 ms). A CPU core is idle when the share of its time that *other*
processes kept it busy, read from ``/proc/stat`` over the window, stayed under a threshold (default 50%): the
scanner's own CPU time is subtracted, so a scan re-checking between cases does not see itself as a job.

The checks fail safe: a device is idle only when it was *measured* idle. NVML that cannot be opened, a handle it
will not give, a process list or a utilization sample that raises, ``/proc/stat`` that cannot be read or does
not list the core: the device is busy, the error in the reason (and in :attr:`IdleMonitor.error`, which the
scan's ``--json`` summary carries as ``idle_error``). A golden GEMM on a GPU in the middle of a training job
costs the job time and makes the results noise; a missed scan costs one scan. The one exception is a measurement
the device does not support at all (NVML's NOT_SUPPORTED: utilization of a MIG instance, graphics processes of
a compute-only board): the other signal decides, and a GPU where neither the compute processes nor the
utilization can be measured is busy. ``--all`` (``only_idle=False``) scans without asking.

:class:`IdleMonitor` answers "did a job appear since the last check?" between cases, cheaply (no extra window:
it compares with the previous reading). :class:`DeviceLock` is an ``flock`` on one file per device in a lock
directory, so two scanners (cron overlapping itself, two CronJobs) never share a device; the kernel drops the lock
when the holder dies, so a killed scanner never leaves a device locked.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from pathlib import Path
from typing import Any

from .discovery import ScanTarget, open_nvml

__all__ = ["IdleMonitor", "DeviceLock", "DeviceLocked", "default_lock_dir", "read_cpu_times"]

DEFAULT_WINDOW_S = 1.0
DEFAULT_GPU_UTIL_MAX = 5.0
DEFAULT_CPU_BUSY_MAX = 50.0


def default_lock_dir() -> Path:
    """``$SDCGUARD_LOCK_DIR``, else ``$XDG_RUNTIME_DIR/sdcguard-locks``, else ``/tmp/sdcguard-locks``."""
    env = os.environ.get("SDCGUARD_LOCK_DIR")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "sdcguard-locks"
    return Path("/tmp/sdcguard-locks")


class DeviceLocked(Exception):
    """Another scanner holds this device's lock."""


class DeviceLock:
    """An exclusive, non-blocking ``flock`` on ``<lock_dir>/<device>.lock`` (the holder's pid is written in it)."""

    def __init__(self, device: str, lock_dir: Path | None = None) -> None:
        self.device = device
        directory = Path(lock_dir) if lock_dir is not None else default_lock_dir()
        self.path = directory / (re.sub(r"[^A-Za-z0-9_.-]", "_", device) + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`DeviceLocked` (never waits: a busy device is skipped, not queued)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # scanners of different users on one node must see the same locks
            os.chmod(self.path.parent, 0o1777)
        except OSError:
            pass
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = self._holder()
                raise DeviceLocked(
                    f"{self.device} is being scanned by another scanner"
                    + (f" (pid {holder})" if holder else "")
                    + f" (lock {self.path})"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def _holder(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DeviceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_cpu_times(stat_text: str | None = None) -> dict[int, tuple[int, int]]:
    """``{core: (busy_ticks, total_ticks)}`` from ``/proc/stat`` (idle and iowait count as not busy)."""
    if stat_text is None:
        with open("/proc/stat") as f:
            stat_text = f.read()
    out = {}
    for line in stat_text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if not name[3:].isdigit():
            continue
        ticks = [int(x) for x in fields]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        # guest time is already included in user time: leave it out of the total (fields 9 and 10)
        total = sum(ticks[:8])
        out[int(name[3:])] = (total - idle, total)
    return out


def _own_cpu_ticks() -> int:
    """CPU ticks (user + system) this process and its waited-for children used so far."""
    t = os.times()
    return round((t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK"))


class _Unmeasurable(Exception):
    """An idle check could not measure what it needs: the device counts as busy."""


def _not_supported(nvml: Any, error: BaseException) -> bool:
    """NVML's NOT_SUPPORTED (the board cannot measure this at all), as opposed to an error of the call."""
    code = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
    return (
        getattr(error, "value", None) == code
        or type(error).__name__ == "NVMLError_NotSupported"
        or str(error).strip().lower() == "not supported"
    )


class IdleMonitor:
    """Idle checks for one device: ``busy_reason()`` before a scan, ``job_appeared()`` between cases."""

    def __init__(
        self,
        target: ScanTarget,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        gpu_util_max: float = DEFAULT_GPU_UTIL_MAX,
        cpu_busy_max: float = DEFAULT_CPU_BUSY_MAX,
    ) -> None:
        self.target = target
        self.window_s = window_s
        self.gpu_util_max = gpu_util_max
        self.cpu_busy_max = cpu_busy_max
        self.error: str | None = None
        """The measurement error that made the device busy at the last check (None: it was measured)."""
        self._nvml: Any = None
        self._handle: Any = None
        self._open_error: str | None = None
        if target.kind == "gpu":
            self._nvml, self._open_error = open_nvml()
            if self._nvml is not None:
                try:
                    self._handle = self._nvml.nvmlDeviceGetHandleByIndex(target.index)
                except Exception as e:
                    self._open_error = f"nvmlDeviceGetHandleByIndex({target.index}) failed: {e or type(e).__name__}"
        self._last_cpu: tuple[int, int, int] | None = None  # busy, total, own ticks at the last check

    # --- GPU -------------------------------------------------------------------------------------------------
    def _gpu_processes(self) -> tuple[list[int], bool]:
        """Other processes on the GPU, and whether its compute processes could be listed at all."""
        if self._open_error is not None:
            raise _Unmeasurable(self._open_error)
        n, h = self._nvml, self._handle
        pids: list[int] = []
        listed = False
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                pids += [p.pid for p in getattr(n, fn)(h)]
            except Exception as e:
                if _not_supported(n, e):
                    continue  # the other signals decide
                raise _Unmeasurable(f"{fn} failed: {e or type(e).__name__}") from None
            listed = listed or fn == "nvmlDeviceGetComputeRunningProcesses"
        # The scanner itself (and its retest children) show up once CuPy made a context: not a job.
        ours = {os.getpid(), os.getppid()}
        return [p for p in pids if p not in ours], listed

    def _gpu_busy_now(self) -> tuple[str | None, bool]:
        pids, listed = self._gpu_processes()
        if pids:
            return f"compute process(es) {', '.join(map(str, pids[:5]))} on the GPU", listed
        return None, listed

    def _gpu_busy_window(self) -> str | None:
        reason, listed = self._gpu_busy_now()
        if reason:
            return reason
        n, h = self._nvml, self._handle
        deadline = time.monotonic() + self.window_s
        peak: float | None = 0.0
        while True:
            try:
                peak = max(peak or 0.0, float(n.nvmlDeviceGetUtilizationRates(h).gpu))
            except Exception as e:
                if not _not_supported(n, e):
                    raise _Unmeasurable(f"nvmlDeviceGetUtilizationRates failed: {e or type(e).__name__}") from None
                peak = None  # a MIG instance has no utilization of its own: the process list decides
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.1, self.window_s))
        if peak is None and not listed:
            raise _Unmeasurable("NVML supports neither listing the GPU's compute processes nor its utilization")
        if peak is not None and peak > self.gpu_util_max:
            return f"GPU utilization {peak:.0f}% > {self.gpu_util_max:.0f}% over {self.window_s:g} s"
        return None

    # --- CPU -------------------------------------------------------------------------------------------------
    def _cpu_reading(self) -> tuple[int, int, int]:
        try:
            times = read_cpu_times()
        except (OSError, ValueError, IndexError) as e:
            raise _Unmeasurable(f"cannot read /proc/stat: {e}") from None
        if self.target.index not in times:
            raise _Unmeasurable(f"core {self.target.index} is not listed in /proc/stat (offline?)")
        busy, total = times[self.target.index]
        return busy, total, _own_cpu_ticks()

    def _cpu_busy_since(self, before: tuple[int, int, int], after: tuple[int, int, int]) -> float:
        busy = after[0] - before[0]
        total = after[1] - before[1]
        own = after[2] - before[2]
        if total <= 0:
            raise _Unmeasurable(f"core {self.target.index} counted no time in /proc/stat over the window (offline?)")
        # Our own ticks may have landed on another core (only the scanning thread is pinned): clamp at zero.
        return max(0.0, busy - own) / total * 100.0

    def _cpu_busy_window(self) -> str | None:
        before = self._cpu_reading()
        time.sleep(self.window_s)
        after = self._cpu_reading()
        self._last_cpu = after
        share = self._cpu_busy_since(before, after)
        if share > self.cpu_busy_max:
            return f"core {self.target.index} {share:.0f}% busy with other processes over {self.window_s:g} s"
        return None

    def _cpu_job_appeared(self) -> str | None:
        now = self._cpu_reading()
        before, self._last_cpu = self._last_cpu, now
        if before is None or now[1] - before[1] < 50:
            # too short an interval for a meaningful share (ticks are 10 ms): keep accumulating
            self._last_cpu = before if before is not None else now
            return None
        share = self._cpu_busy_since(before, now)
        if share > self.cpu_busy_max:
            return f"core {self.target.index} {share:.0f}% busy with other processes"
        return None

    def _checked(self, check: Any) -> str | None:
        """Run one check; a measurement that failed makes the device busy, its error kept in :attr:`error`."""
        self.error = None
        try:
            return check()
        except _Unmeasurable as e:
            self.error = str(e)
            return f"cannot tell whether {self.target.device} is idle, so it counts as busy: {e}"

    # --- public ----------------------------------------------------------------------------------------------
    def busy_reason(self) -> str | None:
        """Why the device is not idle now (measured over the window), or None when it was measured idle."""
        if self.target.kind == "gpu":
            return self._checked(self._gpu_busy_window)
        if self.target.kind == "cpu":
            return self._checked(self._cpu_busy_window)
        return None

    def job_appeared(self) -> str | None:
        """Between cases: a job appeared since the previous check? (cheap; the reason, or None). A check that
        cannot measure any more stops the scan too."""
        if self.target.kind == "gpu":
            return self._checked(lambda: self._gpu_busy_now()[0])
        if self.target.kind == "cpu":
            return self._checked(self._cpu_job_appeared)
        return None
