"""The CPU backend: runs the golden cases with numpy on one pinned core, a CPU SDC scanner in its own right.

The calling thread is pinned to the core with ``os.sched_setaffinity(0, {core})`` and BLAS is told to use one
thread, so a GEMM really runs on the core whose id the result carries (OpenBLAS's worker threads would otherwise
float to other cores). Every run compares the output bit for bit with the golden (as unsigned integers).
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cpu_time import slow_down
from ..devices import cpu_id
from ..errors import NoDevice, SuiteError
from ..records import CaseResult
from .backend import BackendBase, OutputHook, slow_factor
from .bits import failure_digest, hex_bits
from .cases import Case
from .compare import compare_bits
from .cpu_kernels import RUNNERS, MarchError
from .suite import Suite

__all__ = ["NumpyBackend"]

# The CPUs this process may use, as it started: a backend pinning this thread to one core must not hide the
# others from the next backend (a scanner checks several cores from one thread).
_PROCESS_CPUS = frozenset(os.sched_getaffinity(0))


@functools.cache
def _openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """``(get, set)`` for the number of threads of the OpenBLAS numpy links against, if it can be found."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return None
    for path in libs:
        if not path.startswith("/"):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype = ctypes.c_int
                    return (lambda g=get: int(g())), (lambda n, p=put: p(ctypes.c_int(n)))
    return None


class NumpyBackend(BackendBase):
    """Runs golden cases on CPU core ``core`` (device id ``cpu:<host>:<core>``, location ``core:<core>``)."""

    kind = "numpy"
    arch = "cpu"

    def __init__(self, core: int, *, suite: Suite | None = None) -> None:
        current = os.sched_getaffinity(0)
        allowed = _PROCESS_CPUS | current
        if core not in allowed:
            raise NoDevice(f"CPU core {core} is not available to this process (allowed: {sorted(allowed)})")
        self.core = core
        self.device: str = cpu_id(core)
        self.location = f"core:{core}"
        self._suite = suite
        self._scratch: dict[str, dict[str, Any]] = {}
        self._spare: dict[str, dict[str, Any]] = {}
        """Scratch of the slow drill's repeated work (never the buffers a failure is read back from)."""
        self._saved_affinity = current
        blas = _openblas_threads()
        self._saved_blas_threads = blas[0]() if blas else None
        if blas:
            blas[1](1)  # BLAS runs in the calling (pinned) thread
        self.blas_pinned = blas is not None
        self._pin()

    def close(self) -> None:
        """Give the thread the CPU affinity it had when this backend was made (and BLAS its thread count) back;
        drop scratch buffers. Close backends in the reverse order of their creation."""
        os.sched_setaffinity(0, self._saved_affinity)
        blas = _openblas_threads()
        if blas and self._saved_blas_threads is not None:
            blas[1](self._saved_blas_threads)
        self._scratch.clear()
        self._spare.clear()

    def _pin(self) -> None:
        try:
            os.sched_setaffinity(0, {self.core})
        except OSError as e:
            raise NoDevice(f"cannot pin to CPU core {self.core}: {e}") from None

    def supports(self, case: Case) -> bool:
        """False for GPU-only cases (``intrinsics``: per-architecture goldens)."""
        return not case.gpu_only and case.family in RUNNERS

    def cases(self) -> tuple[Case, ...]:
        """The suite's cases this backend runs, in order."""
        return tuple(c for c in self.suite.cases if self.supports(c))

    def prepare(self, cases: tuple[Case, ...] | None = None) -> None:
        """Build every input and expected output now (about a second in all), so that a timed budget pays for
        none of it: call it before starting the clock."""
        for case in cases if cases is not None else self.cases():
            self.suite.inputs(case)
            self.suite.expected(case)

    def run(self, case: Case, *, output_hook: OutputHook | None = None) -> CaseResult:
        """Run ``case`` once on the pinned core and compare its output bit for bit with the golden.

        Golden-data problems raise ``GoldenDataError`` and an unrunnable case ``SuiteError``: never a failed result.
        """
        if not self.supports(case):
            raise SuiteError(f"{case.id}: the numpy backend does not run {case.family} cases (GPU only)")
        suite = self.suite
        expected = suite.expected(case)
        inputs = suite.inputs(case)
        scratch = self._scratch.setdefault(case.id, {})
        self._pin()
        started = time.time()
        # The thread's CPU time, not wall time: what the core did, so a loaded host's preemption is not slowness
        # (sdcguard.fleet.slow compares these times across cores of one model).
        t0 = time.thread_time()
        output, march = RUNNERS[case.family](case, inputs, scratch)
        if output_hook is not None:
            output = output_hook(case.id, output)
            if not isinstance(output, np.ndarray):
                raise SuiteError(f"output hook returned {type(output).__name__} for {case.id}, not an ndarray")
        mismatch = compare_bits(expected, output)
        duration = time.thread_time() - t0
        if (factor := slow_factor(output_hook, case.id)) > 1.0:  # the slow drill: cycles burnt on this core
            spare = self._spare.setdefault(case.id, {})
            slow_down(lambda: RUNNERS[case.family](case, inputs, spare), started=t0, factor=factor)
            duration = time.thread_time() - t0
        if mismatch is None and march is None:
            return CaseResult(
                device=self.device,
                case=case.id,
                family=case.family,
                seed=case.seed,
                passed=True,
                duration_s=duration,
                started_at=started,
                location=self.location,
                output_digest=suite.entries[case.id]["output_sha256"],
            )
        return self._failure(case, output, expected, mismatch, march, scratch, duration, started)

    def _failure(
        self,
        case: Case,
        output: np.ndarray,
        expected: np.ndarray,
        mismatch: Any,
        march: MarchError | None,
        scratch: dict[str, Any],
        duration: float,
        started: float,
    ) -> CaseResult:
        size = expected.dtype.itemsize
        detail: dict[str, Any] = {"backend": self.kind, "dtype": case.dtype, "out_dtype": case.out_dtype}
        if mismatch is not None:
            element, exp_hex, act_hex, xor_hex, count = (
                mismatch.element,
                mismatch.expected,
                mismatch.actual,
                mismatch.xor_mask,
                mismatch.count,
            )
            if len(case.shape) == 2:
                detail["row"], detail["col"] = divmod(element, case.shape[1])
        else:
            assert march is not None
            element, count = march.element, march.count
            exp_hex, act_hex = hex_bits(march.expected, size), hex_bits(march.actual, size)
            xor_hex = hex_bits(march.expected ^ march.actual, size)
        if case.family == "memory":
            buf = scratch["buf"]
            detail["address"] = hex(buf.ctypes.data + element * buf.itemsize)
            if march is not None:
                detail["march"] = {
                    "phase": march.phase,
                    "element": march.element,
                    "expected": hex_bits(march.expected, size),
                    "actual": hex_bits(march.actual, size),
                    "second_read": hex_bits(march.second_read, size),
                    "count": march.count,
                    "stored_value_corrupt": march.second_read != march.expected,
                }
            if mismatch is not None:
                # read the stored word again: if it is right, the wrong value was a transient read
                second = int(buf.view(np.uint32)[element])
                detail["second_read"] = hex_bits(second, size)
                detail["stored_value_corrupt"] = second != int(expected.view(np.uint32)[element])
        return CaseResult(
            device=self.device,
            case=case.id,
            family=case.family,
            seed=case.seed,
            passed=False,
            duration_s=duration,
            started_at=started,
            mismatches=count,
            element=element,
            output_digest=failure_digest(
                output, None if march is None else (march.element, march.expected, march.actual)
            ),
            expected=exp_hex,
            actual=act_hex,
            xor_mask=xor_hex,
            location=self.location,
            detail=detail,
        )
