"""The host build: every ``kernels/*.cu`` compiled with g++ against ``kernels/host/cuda_host.h`` and run on the
CPU through the same launch plans as a GPU, so CI checks every kernel's logic against the goldens without a GPU.

``HostBuild(workdir)`` compiles one shared library (one translation unit per kernel file plus the launcher);
``HostBackend(build)`` runs cases with the ``run(case, *, output_hook=None)`` contract of the real backends. Its
locations are fake SM ids (block index modulo ``fake_sms``) and its device id is ``host-build``: results of an
emulation, never recorded in a fleet store.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SuiteError
from ..records import CaseResult
from ..resources import kernels_dir
from .backend import OutputHook, default_suite
from .cases import Case
from .kernel_run import kernel_case_result
from .launch import Launch, Plan, plan_for, runs_on_kernels
from .suite import Suite

__all__ = ["HostBuild", "HostBackend", "kernel_files", "entry_points"]

_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(')
_NUMPY_SCALARS = {"i32": np.int32, "u32": np.uint32, "u64": np.uint64}
_BY_DTYPE = {"int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64}


def kernel_files() -> list[Path]:
    """Every kernel source, ``kernels/*.cu``."""
    return sorted(kernels_dir().glob("*.cu"))


def entry_points(path: Path) -> list[str]:
    """The ``extern "C" __global__`` functions a kernel file defines."""
    return _ENTRY.findall(path.read_text())


class HostBuild:
    """The kernels compiled for this CPU into ``workdir/libsdchost.so``."""

    def __init__(self, workdir: Path, *, compiler: str = "g++", fake_sms: int = 7) -> None:
        cxx = shutil.which(compiler)
        if cxx is None:
            raise SuiteError(f"host build needs a C++ compiler ({compiler} not found)")
        workdir.mkdir(parents=True, exist_ok=True)
        kdir = kernels_dir()
        units = []
        self.kernels: dict[str, str] = {}
        for cu in kernel_files():
            names = entry_points(cu)
            self.kernels.update({n: cu.name for n in names})
            unit = workdir / f"unit_{cu.stem}.cpp"
            unit.write_text(
                f'#include "{cu}"\n#include "sdc_host_registry.h"\n' + "".join(f"SDC_REGISTER({n})\n" for n in names)
            )
            units.append(unit)
        self.library = workdir / "libsdchost.so"
        cmd = [
            cxx,
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wno-unused-function",
            f"-I{kdir}",
            f"-I{kdir / 'host'}",
            "-include",
            str(kdir / "host" / "cuda_host.h"),
            *map(str, units),
            str(kdir / "host" / "harness.cpp"),
            "-o",
            str(self.library),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SuiteError(f"host build failed:\n{proc.stderr[-4000:]}")
        self.warnings = proc.stderr
        self._lib = ctypes.CDLL(str(self.library))
        self._lib.sdc_host_launch.restype = ctypes.c_int
        self._lib.sdc_host_set_fake_sms(ctypes.c_uint(fake_sms))
        self.fake_sms = fake_sms

    def launch(self, launch: Launch, buffers: dict[str, np.ndarray]) -> None:
        """Run one launch of a plan over host buffers (cuLaunchKernel's argument convention)."""
        args: list[Any] = []
        for arg in launch.args:
            if arg[0] == "buf":
                args.append(buffers[arg[1]][arg[2] :])
            else:
                args.append(_NUMPY_SCALARS[arg[0]](arg[1]))
        self.call(launch.kernel, launch.grid, launch.block, args)

    def call(self, kernel: str, grid: tuple[int, ...], block: tuple[int, ...], args: Any) -> None:
        """Launch ``kernel`` the way ``cupy.RawKernel.__call__`` does: arrays by pointer, numpy scalars by value."""
        holders: list[Any] = []
        for a in args:
            if isinstance(a, np.ndarray):
                holders.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, np.generic) and a.dtype.name in _BY_DTYPE:
                holders.append(_BY_DTYPE[a.dtype.name](a.item()))
            else:
                raise SuiteError(f"host build: unsupported kernel argument {a!r} for {kernel}")
        argv = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        g = (ctypes.c_uint * 3)(*(tuple(grid) + (1, 1, 1))[:3])
        b = (ctypes.c_uint * 3)(*(tuple(block) + (1, 1, 1))[:3])
        if self._lib.sdc_host_launch(kernel.encode(), g, b, argv) != 0:
            raise SuiteError(f"host build has no kernel {kernel}")


class HostBackend:
    """Runs the kernel-backed cases of the suite through a :class:`HostBuild` (GPU kernels, CPU emulation)."""

    kind = "host"
    device = "host-build"
    arch = "host-emulation"
    """The 'architecture' per-architecture goldens of GPU-only cases would be recorded for (tests only)."""

    def __init__(self, build: HostBuild, *, suite: Suite | None = None, sm_count: int = 2) -> None:
        self.build = build
        self.suite = suite or default_suite()
        self.sm_count = sm_count

    def supports(self, case: Case) -> bool:
        if case.gpu_only:
            return (case.id, self.arch) in self.suite.arch_entries
        return runs_on_kernels(case)

    def _case_inputs(self, case: Case) -> dict[str, np.ndarray]:
        # GPU-only cases without a recorded golden have no manifest digest to check their inputs against
        if case.gpu_only and not any(cid == case.id for cid, _ in self.suite.arch_entries):
            return _inputs(case)
        return self.suite.inputs(case)

    def plan(self, case: Case) -> Plan:
        return plan_for(case, self._case_inputs(case), sm_count=self.sm_count)

    def execute(self, case: Case) -> tuple[Plan, dict[str, np.ndarray]]:
        """Run every launch of the case's plan; the scratch buffers afterwards."""
        inputs = self._case_inputs(case)
        plan = plan_for(case, inputs, sm_count=self.sm_count)
        buffers: dict[str, np.ndarray] = {k: v for k, v in inputs.items() if not k.startswith("_")}
        scratch = {name: np.zeros(n, dtype=dt) for name, (dt, n) in plan.scratch.items()}
        buffers.update(scratch)
        for launch in plan.launches:
            self.build.launch(launch, buffers)
        return plan, scratch

    def run(self, case: Case, *, output_hook: OutputHook | None = None) -> CaseResult:
        if not self.supports(case):
            raise SuiteError(f"{case.id}: not run by the host build (cuBLAS, or no golden for {self.arch})")
        arch = self.arch if case.gpu_only else None
        expected = self.suite.expected(case, arch)
        started = time.time()
        t0 = time.perf_counter()
        plan, host = self.execute(case)
        out = host[plan.output]
        return kernel_case_result(
            case=case,
            plan=plan,
            expected=expected,
            golden_digest=self.suite.entry_for(case, arch)["output_sha256"],
            host=host,
            output_hook=output_hook,
            device=self.device,
            started=started,
            duration=time.perf_counter() - t0,
            reread=lambda e: int(out[e]),
            detail={"backend": "host", "fake_sms": self.build.fake_sms},
        )


def _inputs(case: Case) -> dict[str, np.ndarray]:
    from .inputs import make_inputs

    return make_inputs(case)
