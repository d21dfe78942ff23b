"""Load the CUDA sources of ``kernels/`` with CuPy: one compiled ``RawModule`` per (file, device), cached.

The source gets ``#line 1 "<file>"`` in front so compiler errors name the real file; ``-I kernels/`` resolves
``sdc_common.cuh``. Each file exposes ``extern "C"`` entry points (the golden kernels: one per dtype). Users: the
golden suite (``kernels/*.cu``) and the fingerprint (``kernels/fingerprint/chunk_sums.cu``). cupy is imported here,
on first use. A source that is missing or does not compile is a broken install, never a device fault:
:class:`~sdcguard.errors.SuiteError`.
"""

from __future__ import annotations

import functools
from typing import Any

from .errors import SuiteError
from .resources import kernels_dir

__all__ = ["kernel_source", "load_module", "get_kernel", "compile_ptx", "kernel_sources"]


def kernel_sources() -> list[str]:
    """Every CUDA source under ``kernels/``, by name relative to it (``alu.cu``, ``fingerprint/chunk_sums.cu``)."""
    root = kernels_dir()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.cu"))


def kernel_source(name: str) -> str:
    """The text NVRTC compiles for ``kernels/<name>``: the file behind a ``#line`` directive naming it."""
    path = kernels_dir() / name
    if not path.is_file():
        raise SuiteError(f"kernel source {path} is missing (broken install?)")
    return f'#line 1 "{path}"\n' + path.read_text()


def _options() -> tuple[str, ...]:
    return ("-std=c++17", f"-I{kernels_dir()}")


@functools.cache
def load_module(name: str, device: int) -> Any:
    """The compiled ``cupy.RawModule`` of ``kernels/<name>`` for CUDA device ``device`` (compiled once)."""
    import cupy

    with cupy.cuda.Device(device):
        try:
            module = cupy.RawModule(code=kernel_source(name), options=_options())
            module.compile()
        except cupy.cuda.compiler.CompileException as e:
            raise SuiteError(f"kernel {name} does not compile: {str(e).splitlines()[0]}") from None
    return module


def get_kernel(name: str, entry: str, device: int) -> Any:
    """The ``extern "C"`` function ``entry`` of ``kernels/<name>`` on device ``device``."""
    return load_module(name, device).get_function(entry)


def compile_ptx(name: str, arch: str = "compute_80") -> str:
    """Compile ``kernels/<name>`` to PTX with NVRTC alone (no GPU or driver needed): the CI proof that every kernel
    builds for an architecture. Raises ``SuiteError`` with NVRTC's log (which names the real file) on failure."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(kernel_source(name), name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *_options()])
        except nvrtc.NVRTCError as e:
            raise SuiteError(f"kernel {name} does not compile for {arch}: {e}\n{nvrtc.getProgramLog(prog)}") from None
        ptx = nvrtc.getPTX(prog)
        return ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    finally:
        nvrtc.destroyProgram(prog)
