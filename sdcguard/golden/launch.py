"""Launch plans: which kernel of ``kernels/*.cu`` runs each case, with what geometry and arguments.

One plan serves the CuPy backend on a GPU and the host build in CI (the same source compiled with g++), so the
host build checks exactly the launches a GPU performs. Buffers named in a plan are either the case's inputs or
scratch buffers the runner zeroes before the first launch; the scratch buffer ``smids`` receives every block's SM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import numpy as np

from .cases import Case

__all__ = ["Arg", "Launch", "Plan", "plan_for", "runs_on_kernels", "MEMORY_PHASES", "ERR_WORDS"]

Arg: TypeAlias = tuple[Literal["buf"], str, int] | tuple[Literal["i32", "u32", "u64"], int]
"""``("buf", name, element_offset)`` for a buffer, or ``("i32"|"u32"|"u64", value)`` for a scalar."""

ERR_WORDS = 9
"""Size of a memory march's error record (see ``kernels/memory.cu``)."""


@dataclass(frozen=True, kw_only=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Arg, ...]
    phase: str = ""
    """What this launch does (memory marches name the failing phase with it)."""

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclass(frozen=True, kw_only=True)
class Plan:
    module: str
    """File under ``kernels/``."""
    scratch: dict[str, tuple[str, int]]
    """Zeroed buffers: name -> (numpy dtype, elements)."""
    output: str
    """The scratch buffer that holds the output (its first ``case.size`` elements)."""
    launches: tuple[Launch, ...]
    element_block: Callable[[int], int | None] = field(repr=False)
    """Flat output element -> index into ``smids`` of the block that produced it (None: many blocks did)."""


def _buf(name: str, offset: int = 0) -> Arg:
    return ("buf", name, offset)


def _grid_stride(n: int, sm_count: int, block: int = 256, per_sm: int = 4) -> int:
    return max(1, min(-(-n // block), sm_count * per_sm))


def _gemm_mma(case: Case) -> Plan:
    m, n, k = (case.params[x] for x in ("m", "n", "k"))
    gx, gy = n // 32, m // 16
    launch = Launch(
        kernel=f"gemm_mma_{case.dtype}",
        grid=(gx, gy, 1),
        block=(128, 1, 1),
        args=(_buf("a"), _buf("b"), _buf("out"), _buf("smids"), ("i32", m), ("i32", n), ("i32", k)),
    )

    def element_block(e: int) -> int:
        r, c = divmod(e, n)
        return (r // 16) * gx + c // 32

    return Plan(
        module="gemm_mma.cu",
        scratch={"out": ("float32", m * n), "smids": ("uint32", gx * gy)},
        output="out",
        launches=(launch,),
        element_block=element_block,
    )


def _strided(n: int, grid: int, block: int = 256) -> Callable[[int], int | None]:
    return lambda e: (e // block) % grid


def _alu(case: Case, sm_count: int) -> Plan:
    n, rounds = case.params["n"], case.params["rounds"]
    grid = _grid_stride(n, sm_count)
    t = "uint32" if case.dtype == "u32" else "uint64"
    args = tuple(_buf(x) for x in ("x", "y", "mul", "add", "s1", "s2", "out", "smids")) + (("i32", n), ("i32", rounds))
    return Plan(
        module="alu.cu",
        scratch={"out": (t, n), "smids": ("uint32", grid)},
        output="out",
        launches=(Launch(kernel=f"alu_{case.dtype}", grid=(grid, 1, 1), block=(256, 1, 1), args=args),),
        element_block=_strided(n, grid),
    )


_IEEE_OPS = {"div": 0, "sqrt": 1, "fma": 2}


def _ieee(case: Case, sm_count: int) -> Plan:
    n, op = case.params["n"], case.params["op"]
    grid = _grid_stride(n, sm_count)
    if op in _IEEE_OPS:
        b = "b" if op != "sqrt" else "a"
        c = "c" if op == "fma" else "a"
        kernel = f"ieee_{case.dtype}"
        args: tuple[Arg, ...] = (
            _buf("a"),
            _buf(b),
            _buf(c),
            _buf("out"),
            _buf("smids"),
            ("i32", n),
            ("i32", _IEEE_OPS[op]),
        )
    else:
        kernel = {"cvt_fp16": "cvt_fp32_fp16", "cvt_bf16": "cvt_fp32_bf16", "cvt_fp32": "cvt_fp64_fp32"}[op]
        args = (_buf("a"), _buf("out"), _buf("smids"), ("i32", n))
    return Plan(
        module="ieee.cu",
        scratch={"out": (case.out_dtype, n), "smids": ("uint32", grid)},
        output="out",
        launches=(Launch(kernel=kernel, grid=(grid, 1, 1), block=(256, 1, 1), args=args),),
        element_block=_strided(n, grid),
    )


def _intrinsics(case: Case, sm_count: int) -> Plan:
    n = case.params["n"]
    grid = _grid_stride(n, sm_count)
    args: tuple[Arg, ...] = (_buf("x"), _buf("y"), _buf("out"), _buf("smids"), ("i32", n))
    return Plan(
        module="intrinsics.cu",
        scratch={"out": ("float32", 5 * n), "smids": ("uint32", grid)},
        output="out",
        launches=(Launch(kernel="intrinsics_fp32", grid=(grid, 1, 1), block=(256, 1, 1), args=args),),
        element_block=lambda e: ((e % n) // 256) % grid,
    )


MEMORY_PHASES = ("write", "ascending", "descending", "modulo20", "verify")
_KIND = {"moving_inversions": 0, "modulo20": 1, "address": 2, "random": 3}


def _memory(case: Case, inputs: dict[str, np.ndarray], sm_count: int, words: int | None) -> Plan:
    n = max(case.params["words"], words or 0)
    kind = _KIND[case.params["pattern"]]
    p, salt = int(inputs["pattern"][0]), int(inputs["salt"][0])
    grid = _grid_stride(n, sm_count, per_sm=8)
    geo = {"grid": (grid, 1, 1), "block": (256, 1, 1)}
    launches: list[Launch] = []

    def write(offset: int, invert: int) -> None:
        i = len(launches)
        launches.append(
            Launch(
                kernel="mem_write_u32",
                phase="write",
                **geo,
                args=(
                    _buf("out"),
                    ("u64", n),
                    ("u32", kind),
                    ("u32", p),
                    ("u32", salt),
                    ("u32", offset),
                    ("u32", invert),
                    _buf("smids", i * grid),
                ),
            )
        )

    def check(offset: int, invert: int, rewrite: int, descending: int, phase: str) -> None:
        i = len(launches)
        launches.append(
            Launch(
                kernel="mem_check_u32",
                phase=phase,
                **geo,
                args=(
                    _buf("out"),
                    ("u64", n),
                    ("u32", kind),
                    ("u32", p),
                    ("u32", salt),
                    ("u32", offset),
                    ("u32", invert),
                    ("u32", rewrite),
                    ("u32", descending),
                    ("u32", i),
                    _buf("err"),
                    _buf("smids", i * grid),
                ),
            )
        )

    if kind == 0:
        write(0, 0)
        check(0, 0, 1, 0, "ascending")  # read p, write ~p
        check(0, 1, 1, 1, "descending")  # read ~p, write p
        last_writer_descending = True
    elif kind == 1:
        for off in (int(o) for o in inputs["offsets"]):
            write(off, 0)
            check(off, 0, 0, 0, "modulo20")
        last_writer_descending = False
    else:
        write(0, 0)
        check(0, 0, 1, 0, "ascending")  # read the pattern, write its inverse
        last_writer_descending = False
    last = len(launches) - 1 if kind != 1 else len(launches) - 2  # the launch that wrote the final contents

    def element_block(e: int) -> int:
        j = n - 1 - e if last_writer_descending else e
        return last * grid + (j // 256) % grid

    return Plan(
        module="memory.cu",
        scratch={"out": ("uint32", n), "err": ("uint32", ERR_WORDS), "smids": ("uint32", grid * len(launches))},
        output="out",
        launches=tuple(launches),
        element_block=element_block,
    )


def _shared(case: Case, sm_count: int) -> Plan:
    n = case.params["n"]
    if case.dtype == "u32":
        nb = n // 256
        return Plan(
            module="shared.cu",
            scratch={"out": ("uint32", 2 * nb + 258), "smids": ("uint32", nb)},
            output="out",
            launches=(
                Launch(
                    kernel="shared_reduce_u32",
                    grid=(nb, 1, 1),
                    block=(256, 1, 1),
                    args=(_buf("x"), _buf("out"), _buf("smids"), ("i32", n)),
                ),
            ),
            element_block=lambda e: e % nb if e < 2 * nb else None,
        )
    grid = _grid_stride(n, sm_count)
    return Plan(
        module="shared.cu",
        scratch={"out": ("uint64", 129), "smids": ("uint32", grid)},
        output="out",
        launches=(
            Launch(
                kernel="shared_bins_u64",
                grid=(grid, 1, 1),
                block=(256, 1, 1),
                args=(_buf("x"), _buf("out"), _buf("smids"), ("i32", n)),
            ),
        ),
        element_block=lambda e: None,
    )


def runs_on_kernels(case: Case) -> bool:
    """True when a case runs through our kernels: everything but the cuBLAS GEMMs."""
    return not (case.family == "gemm" and case.params["impl"] != "mma")


def plan_for(case: Case, inputs: dict[str, np.ndarray], *, sm_count: int, memory_words: int | None = None) -> Plan:
    """The launch plan of a kernel-run case (everything except ``gemm`` cases with ``impl == "cublas"``).

    ``sm_count`` sizes grid-stride launches; ``memory_words`` lets memory marches cover more than the golden's
    words (the golden compares the first ``case.size`` words, the in-kernel checks the whole buffer).
    """
    if case.family == "gemm":
        if case.params["impl"] != "mma":
            raise ValueError(f"{case.id} runs through cuBLAS, not a kernel of ours")
        return _gemm_mma(case)
    if case.family == "alu":
        return _alu(case, sm_count)
    if case.family == "ieee":
        return _ieee(case, sm_count)
    if case.family == "intrinsics":
        return _intrinsics(case, sm_count)
    if case.family == "memory":
        return _memory(case, inputs, sm_count, memory_words)
    if case.family == "shared":
        return _shared(case, sm_count)
    raise ValueError(f"no plan for family {case.family!r}")
