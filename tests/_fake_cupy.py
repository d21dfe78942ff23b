"""A stand-in for cupy whose "device" is this CPU and whose kernels are the host build of kernels/*.cu.

It lets CupyBackend's own code (scratch layout, argument marshalling, the one host sync, the cuBLAS path with its
compute-type pinning, locations, re-reads) run in CI without a GPU. Only the subset CupyBackend and the loader use.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import numpy as np

from sdcguard.golden.hostbuild import HostBuild


class DevArray(np.ndarray):
    """A "device" array: a numpy array with cupy's ``.get()``."""

    def get(self) -> np.ndarray:
        return np.array(self)


def _dev(a: Any) -> DevArray:
    return np.array(a).view(DevArray)


class _Device:
    def __init__(self, index: int) -> None:
        self.index = index

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def install(monkeypatch: Any, build: HostBuild, *, sms: int = 4, arch: tuple[int, int] = (9, 0)) -> dict[str, Any]:
    """Put the fake cupy into ``sys.modules`` (undone by ``monkeypatch``); returns a log of what it was asked."""
    log: dict[str, Any] = {"gets": 0, "compute_types": [], "modules": []}

    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: {
            "major": arch[0],
            "minor": arch[1],
            "multiProcessorCount": sms,
            "name": b"Fake GPU (host build)",
            "uuid": bytes(range(16)),
        },
        memGetInfo=lambda: (64 << 20, 128 << 20),
    )
    compiler = types.SimpleNamespace(CompileException=RuntimeError)
    cuda.Device = _Device
    cuda.runtime = runtime
    cuda.compiler = compiler

    class RawModule:
        def __init__(self, *, code: str, options: tuple[str, ...] = ()) -> None:
            assert code.startswith('#line 1 "'), "the loader must name the real file"
            log["modules"].append(code.splitlines()[0])

        def compile(self) -> None:
            return None

        def get_function(self, name: str) -> Any:
            def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
                build.call(name, grid, block, args)

            return launch

    def get_counting(self: DevArray) -> np.ndarray:
        log["gets"] += 1
        return np.array(self)

    DevArray.get = get_counting
    cupy.cuda = cuda
    cupy.RawModule = RawModule
    cupy.asarray = _dev
    pool = types.SimpleNamespace(free_bytes=lambda: 0, free_all_blocks=lambda: None)
    cupy.get_default_memory_pool = lambda: pool
    cupy.empty = lambda n, dtype: np.empty(n, dtype=dtype).view(DevArray)

    # what the GPU check's timing and references use: events time the host (the "device" is this CPU)
    class Event:
        def __init__(self) -> None:
            self.t = 0.0

        def record(self) -> None:
            self.t = time.perf_counter()

        def synchronize(self) -> None:
            return None

    cuda.Event = Event
    cuda.get_elapsed_time = lambda a, b: (b.t - a.t) * 1e3
    for name in ("float16", "float32", "float64", "uint8", "uint32"):
        setattr(cupy, name, getattr(np, name))

    class Generator:
        def __init__(self, seed: int) -> None:
            self._rng = np.random.default_rng(seed)

        def standard_normal(self, shape: tuple[int, ...], dtype: Any = np.float64) -> DevArray:
            return _dev(self._rng.standard_normal(shape, dtype=dtype))

    cupy.random = types.SimpleNamespace(default_rng=Generator)
    cupy.ones = lambda shape, dtype: _dev(np.ones(shape, dtype=dtype))
    cupy.zeros = lambda shape, dtype: _dev(np.zeros(shape, dtype=dtype))
    cupy.empty_like = lambda a: _dev(np.empty_like(a))
    cupy.copyto = lambda dst, src: np.copyto(dst, src)
    cupy.matmul = lambda a, b: (
        np.matmul(
            np.asarray(a, dtype=np.float32) if a.dtype == np.float16 else a,
            np.asarray(b, dtype=np.float32) if b.dtype == np.float16 else b,
        )
        .astype(a.dtype)
        .view(DevArray)
    )

    core = types.ModuleType("cupy._core")
    linalg = types.ModuleType("cupy._core._routines_linalg")
    state: dict[Any, int] = {}
    for i, name in enumerate(["DEFAULT", "PEDANTIC", "TF32", "FP32", "FP64", "FP16", "BF16"]):
        setattr(linalg, f"COMPUTE_TYPE_{name}", i)
    linalg.get_compute_type = lambda dt: state.get(np.dtype(dt), 0)

    def set_compute_type(dt: Any, mode: int) -> None:
        log["compute_types"].append((np.dtype(dt).name, mode))
        state[np.dtype(dt)] = mode

    linalg.set_compute_type = set_compute_type
    core._routines_linalg = linalg
    cupy._core = core
    for name, mod in (
        ("cupy", cupy),
        ("cupy.cuda", cuda),
        ("cupy._core", core),
        ("cupy._core._routines_linalg", linalg),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    from sdcguard import kernels

    kernels.load_module.cache_clear()
    monkeypatch.setattr(kernels, "load_module", _uncached(kernels.load_module))
    return log


def _uncached(fn: Any) -> Any:
    # the real loader caches per (file, device) for the process; the fake must not leak into later tests
    return getattr(fn, "__wrapped__", fn)
