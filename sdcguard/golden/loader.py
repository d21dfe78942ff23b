"""Load the golden kernels (``kernels/*.cu``) with CuPy: one compiled ``RawModule`` per (file, device), cached.

The source gets ``#line 1 "<file>"`` in front so compiler errors name the real file; ``-I kernels/`` resolves
``sdc_common.cuh``. Each file exposes one ``extern "C"`` entry point per dtype. cupy is imported here, on first use.
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import SuiteError
from ..resources import kernels_dir

__all__ = ["kernel_source", "load_module", "get_kernel", "compile_ptx"]


def kernel_source(name: str) -> str:
    """The text NVRTC compiles for ``kernels/<name>``: the file behind a ``#line`` directive naming it."""
    path = kernels_dir() / name
    if not path.is_file():
        raise SuiteError(f"kernel source {path} is missing (broken install?)")
    return f'#line 1 "{path}"\n' + path.read_text()


@functools.cache
def load_module(name: str, device: int) -> Any:
    """The compiled ``cupy.RawModule`` of ``kernels/<name>`` for CUDA device ``device`` (compiled once)."""
    import cupy

    with cupy.cuda.Device(device):
        try:
            module = cupy.RawModule(code=kernel_source(name), options=("-std=c++17", f"-I{kernels_dir()}"))
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
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17", f"-I{kernels_dir()}"])
        except nvrtc.NVRTCError as e:
            raise SuiteError(f"kernel {name} does not compile for {arch}: {e}\n{nvrtc.getProgramLog(prog)}") from None
        ptx = nvrtc.getPTX(prog)
        return ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    finally:
        nvrtc.destroyProgram(prog)
