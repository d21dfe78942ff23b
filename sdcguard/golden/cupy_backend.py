"""The GPU backend: runs the golden cases on one CUDA device with CuPy and compares bit for bit with the goldens.

GEMM cases with ``impl == "cublas"`` go through ``cupy.matmul`` with cuBLAS's compute type pinned for the dtype
(fp64 -> 64F, fp32 -> 32F pedantic, tf32 -> 32F fast-TF32, fp16 -> 32F accumulation), restored afterwards;
every other case runs our kernels (``kernels/*.cu``, see :mod:`.launch`), which record every block's ``%smid`` so
a wrong element names its SM. Each run zeroes one device scratch buffer, launches, and copies back the prefix that
holds the error record, the SM ids and the golden-sized output in one transfer: one host sync per case.

cupy is imported when a backend is created, never at module import.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..devices import gpu_id
from ..errors import NoDevice, SuiteError
from ..kernels import get_kernel
from ..records import CaseResult
from .backend import BackendBase, OutputHook
from .bits import sha256_bytes
from .cases import Case
from .compare import compare_bits
from .kernel_run import kernel_case_result
from .launch import Plan, plan_for
from .suite import Suite

__all__ = ["CupyBackend", "pinned_compute_type"]

_ALIGN = 256
_SCALARS = {"i32": np.int32, "u32": np.uint32, "u64": np.uint64}
# cuBLAS compute type per case dtype (names of cupy._core._routines_linalg constants)
_COMPUTE = {
    "fp64": "COMPUTE_TYPE_FP64",
    "fp32": "COMPUTE_TYPE_PEDANTIC",
    "tf32": "COMPUTE_TYPE_TF32",
    "fp16": "COMPUTE_TYPE_FP32",
}


@contextlib.contextmanager
def pinned_compute_type(array_dtype: Any, case_dtype: str) -> Iterator[None]:
    """Inside the block, cuBLAS runs products of ``array_dtype`` arrays with the compute type of case dtype
    ``case_dtype`` (``fp64 fp32 tf32 fp16``); the previous setting comes back on exit. cupy must be importable."""
    from cupy._core import _routines_linalg as linalg

    before = linalg.get_compute_type(array_dtype)
    linalg.set_compute_type(array_dtype, getattr(linalg, _COMPUTE[case_dtype]))
    try:
        yield
    finally:
        linalg.set_compute_type(array_dtype, before)


def _uuid_text(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    h = bytes(raw)[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _device_uuid(props: dict[str, Any]) -> str:
    """The GPU's UUID: from the CUDA device properties, else from NVML by PCI address (CUDA and NVML may number
    devices differently, the PCI address is common to both)."""
    if props.get("uuid"):
        return _uuid_text(props["uuid"])
    try:
        import pynvml

        pynvml.nvmlInit()
        bus = f"{props['pciDomainID']:08x}:{props['pciBusID']:02x}:{props['pciDeviceID']:02x}.0"
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByPciBusId(bus))
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception as e:
        raise NoDevice(f"cannot tell the UUID of this GPU (no uuid in its properties, NVML: {e})") from None


class CupyBackend(BackendBase):
    """Runs golden cases on CUDA device ``index`` (device id ``GPU-<uuid>``, locations ``sm:<id>``).

    ``memory_share`` (0..0.9): memory marches cover this share of the device's free memory instead of only the
    golden's 8 MiB; the in-kernel checks (pattern functions) judge every word, the golden the first 8 MiB.
    """

    kind = "cupy"

    def __init__(self, index: int, *, suite: Suite | None = None, memory_share: float = 0.0) -> None:
        if not 0.0 <= memory_share <= 0.9:
            raise ValueError(f"memory_share must be within [0, 0.9], got {memory_share}")
        try:
            import cupy
        except Exception as e:  # ImportError or a broken CUDA install
            raise NoDevice(f"the CUDA backend needs cupy: {type(e).__name__}: {e}") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            raise NoDevice(f"no usable CUDA device: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        if not 0 <= index < count:
            raise NoDevice(f"CUDA device {index} does not exist ({count} visible)")
        self._cp = cupy
        self.index = index
        props = cupy.cuda.runtime.getDeviceProperties(index)
        self.arch = f"sm_{props['major']}{props['minor']}"
        self.sm_count = int(props["multiProcessorCount"])
        self.model = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.device: str = gpu_id(_device_uuid(props))
        self.memory_share = memory_share
        self._suite = suite
        self._inputs: dict[str, dict[str, Any]] = {}
        self._scratch: dict[str, tuple[Any, dict[str, tuple[int, str, int]], int]] = {}
        self._plans: dict[str, Plan] = {}
        self._march_words: int | None = None

    def close(self) -> None:
        """Free the device buffers this backend holds (inputs and scratch); compiled modules stay cached."""
        self._inputs.clear()
        self._scratch.clear()
        self._plans.clear()

    def supports(self, case: Case) -> bool:
        """Every portable case; ``intrinsics`` only where the suite holds goldens for this architecture."""
        if case.gpu_only:
            return (case.id, self.arch) in self.suite.arch_entries
        if case.dtype == "fp8":
            return int(self.arch[3:]) >= 89  # e4m3 tensor cores: Ada, Hopper and newer
        return True

    def cases(self) -> tuple[Case, ...]:
        """The suite's portable cases this GPU has the units for, plus the GPU-only cases recorded for its
        architecture."""
        return tuple(c for c in self.suite.cases if self.supports(c)) + self.suite.arch_cases(self.arch)

    # ------------------------------------------------------------------------------------------------ buffers

    def _device_inputs(self, case: Case) -> dict[str, Any]:
        got = self._inputs.get(case.id)
        if got is None:
            cp = self._cp
            with cp.cuda.Device(self.index):
                got = {k: cp.asarray(v) for k, v in self.suite.inputs(case).items() if not k.startswith("_")}
            self._inputs[case.id] = got
        return got

    def plan(self, case: Case) -> Plan:
        """The launch plan this backend runs a kernel-run case with (memory marches sized by ``memory_share``)."""
        return self._plan(case)

    def _plan(self, case: Case) -> Plan:
        plan = self._plans.get(case.id)
        if plan is None:
            words = self._memory_words() if case.family == "memory" else None
            plan = plan_for(case, self.suite.inputs(case), sm_count=self.sm_count, memory_words=words)
            self._plans[case.id] = plan
        return plan

    def _memory_words(self) -> int | None:
        """Words of a big march: ``memory_share`` of the memory free when first asked (one size for every
        memory case, which share one buffer in turn)."""
        if self.memory_share <= 0:
            return None
        if self._march_words is None:
            cp = self._cp
            with cp.cuda.Device(self.index):
                free, _ = cp.cuda.runtime.memGetInfo()
                free += cp.get_default_memory_pool().free_bytes()  # cached by cupy's pool, free to us
            self._march_words = int(free * self.memory_share) // 4
        return self._march_words

    def _scratch_for(self, case: Case, plan: Plan) -> tuple[Any, dict[str, tuple[int, str, int]], int]:
        """One device buffer for every scratch array of the case: (raw uint8 buffer, layout, bytes to fetch)."""
        got = self._scratch.get(case.id)
        if got is None:
            layout: dict[str, tuple[int, str, int]] = {}
            offset = 0
            # the output goes last: the host fetches err + smids + the golden-sized head of the output only
            names = sorted(plan.scratch, key=lambda n: n == plan.output)
            for name in names:
                dt, count = plan.scratch[name]
                layout[name] = (offset, dt, count)
                offset += -(-count * np.dtype(dt).itemsize // _ALIGN) * _ALIGN
            out_off = layout[plan.output][0]
            fetch = out_off + case.nbytes
            with self._cp.cuda.Device(self.index):
                if case.family == "memory" and self.memory_share > 0:
                    # big marches take turns: drop the previous memory case's buffer before taking a new one
                    for other in [k for k in self._scratch if k.startswith("memory.")]:
                        del self._scratch[other]
                    self._cp.get_default_memory_pool().free_all_blocks()
                raw = self._cp.empty(offset, dtype=np.uint8)
            got = (raw, layout, fetch)
            self._scratch[case.id] = got
        return got

    def prepare(self, cases: tuple[Case, ...] | None = None) -> None:
        """Build expected outputs, upload inputs, allocate scratch and compile every kernel now, so that a timed
        budget pays for none of it: call it before starting the clock."""
        for case in cases if cases is not None else self.cases():
            self.suite.expected(case, self.arch if case.gpu_only else None)
            self._device_inputs(case)
            if case.family == "gemm" and case.params["impl"] == "cublas":
                continue
            plan = self._plan(case)
            self._scratch_for(case, plan)
            for launch in plan.launches:
                get_kernel(plan.module, launch.kernel, self.index)

    # ------------------------------------------------------------------------------------------------ running

    def _launches(self, case: Case) -> tuple[Plan, Any, dict[str, tuple[int, str, int]], int, Callable[[], None]]:
        """``(plan, raw scratch, layout, bytes to fetch, enqueue)``: ``enqueue()`` puts every launch of the case on
        the current stream (no zeroing, no sync). Arguments are marshalled once, here."""
        plan = self._plan(case)
        inputs = self._device_inputs(case)
        raw, layout, fetch = self._scratch_for(case, plan)
        views = {
            name: raw[off : off + count * np.dtype(dt).itemsize].view(dt) for name, (off, dt, count) in layout.items()
        }
        calls = []
        for launch in plan.launches:
            args = []
            for arg in launch.args:
                if arg[0] == "buf":
                    buf = views[arg[1]] if arg[1] in views else inputs[arg[1]]
                    args.append(buf[arg[2] :] if arg[2] else buf)
                else:
                    args.append(_SCALARS[arg[0]](arg[1]))
            calls.append((get_kernel(plan.module, launch.kernel, self.index), launch.grid, launch.block, tuple(args)))

        def enqueue() -> None:
            for fn, grid, block, args in calls:
                fn(grid, block, args)

        return plan, raw, layout, fetch, enqueue

    def device_work(self, case: Case) -> Callable[[], None]:
        """The case's device work alone, to be timed with CUDA events: the launches of a kernel-run case (its
        scratch is not zeroed first), or the cuBLAS product of a ``cublas`` GEMM, with no comparison and no copy
        to the host. Buffers and kernels are set up now, before any timing."""
        cp = self._cp
        if case.family == "gemm" and case.params["impl"] == "cublas":
            inputs = self._device_inputs(case)
            a, b = inputs["a"], inputs["b"]

            def product() -> None:
                with cp.cuda.Device(self.index), pinned_compute_type(a.dtype, case.dtype):
                    cp.matmul(a, b)

            return product
        enqueue = self._launches(case)[4]

        def launches() -> None:
            with cp.cuda.Device(self.index):
                enqueue()

        return launches

    def output(self, case: Case) -> np.ndarray:
        """Run a kernel-run case once and return its output (shape ``case.shape``) without comparing it: how the
        per-architecture goldens of GPU-only cases are taken (:mod:`sdcguard.golden.candidates`)."""
        if case.family == "gemm" and case.params["impl"] == "cublas":
            raise SuiteError(f"{case.id} runs through cuBLAS: run() compares it with its golden")
        cp = self._cp
        with cp.cuda.Device(self.index):
            plan, raw, layout, fetch, enqueue = self._launches(case)
            raw.fill(0)
            enqueue()
            head = raw[:fetch].get()
        off, dt, _ = layout[plan.output]
        return head[off : off + case.nbytes].view(dt).reshape(case.shape).copy()

    def run(self, case: Case, *, output_hook: OutputHook | None = None) -> CaseResult:
        """Run ``case`` once on this GPU and compare its output bit for bit with the golden."""
        if not self.supports(case):
            raise SuiteError(f"{case.id}: no golden for {self.arch} (per-architecture intrinsics goldens)")
        if case.family == "gemm" and case.params["impl"] == "cublas":
            return self._run_cublas(case, output_hook)
        arch = self.arch if case.gpu_only else None
        expected = self.suite.expected(case, arch)
        cp = self._cp
        started = time.time()
        t0 = time.perf_counter()
        with cp.cuda.Device(self.index):
            plan, raw, layout, fetch, enqueue = self._launches(case)
            raw.fill(0)
            enqueue()
            head = raw[:fetch].get()  # the one host sync of this case
        duration = time.perf_counter() - t0
        host = {}
        for name, (off, dt, count) in layout.items():
            n = count if name != plan.output else case.size
            host[name] = head[off : off + n * np.dtype(dt).itemsize].view(dt)
        out_off, out_dt, out_count = layout[plan.output]
        out_view = raw[out_off : out_off + out_count * np.dtype(out_dt).itemsize].view(out_dt)

        def reread(element: int) -> int:
            with cp.cuda.Device(self.index):
                return int(out_view[element : element + 1].get()[0])

        return kernel_case_result(
            case=case,
            plan=plan,
            expected=expected,
            golden_digest=self.suite.entry_for(case, arch)["output_sha256"],
            host=host,
            output_hook=output_hook,
            device=self.device,
            started=started,
            duration=duration,
            reread=reread,
            detail={"backend": self.kind, "arch": self.arch, "words": plan.scratch[plan.output][1]},
        )

    def _run_cublas(self, case: Case, output_hook: OutputHook | None) -> CaseResult:
        cp = self._cp
        expected = self.suite.expected(case)
        inputs = self._device_inputs(case)
        started = time.time()
        t0 = time.perf_counter()
        with cp.cuda.Device(self.index):
            with pinned_compute_type(inputs["a"].dtype, case.dtype):
                product = cp.matmul(inputs["a"], inputs["b"])
            # fp16 results are exact fp16 values by construction: widening to the golden's fp32 is exact
            output = product.astype(case.out_dtype, copy=False).get()  # the one host sync
        duration = time.perf_counter() - t0
        if output_hook is not None:
            output = output_hook(case.id, output)
        mismatch = compare_bits(expected, output)
        if mismatch is None:
            return CaseResult(
                device=self.device,
                case=case.id,
                family=case.family,
                seed=case.seed,
                passed=True,
                duration_s=duration,
                started_at=started,
                output_digest=self.suite.entries[case.id]["output_sha256"],
            )
        row, col = divmod(mismatch.element, case.shape[1])
        return CaseResult(
            device=self.device,
            case=case.id,
            family=case.family,
            seed=case.seed,
            passed=False,
            duration_s=duration,
            started_at=started,
            output_digest=sha256_bytes(output),
            mismatches=mismatch.count,
            element=mismatch.element,
            expected=mismatch.expected,
            actual=mismatch.actual,
            xor_mask=mismatch.xor_mask,
            # cuBLAS's kernels do not record %smid: the gemm.*.mma cases of the same dtype localize to an SM
            location="sm:unknown",
            detail={
                "backend": self.kind,
                "arch": self.arch,
                "impl": "cublas",
                "row": row,
                "col": col,
                "compute_type": _COMPUTE[case.dtype],
            },
        )
