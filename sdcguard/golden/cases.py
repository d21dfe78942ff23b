"""The golden cases: one definition per case (id, family, dtype, shape, seed, parameters, generator version).

Everything else (input generators, reference arithmetic, the numpy and CuPy backends, the CUDA kernels' launch
geometry, the golden files) is keyed by the case id defined here. Changing anything that alters a case's inputs or
expected output must bump :data:`GENERATOR_VERSION` and regenerate ``golden_vectors/``.

Families:

``gemm``
    Known-answer matrix products. ``int`` operands are integers scaled by a power of two per row of A and per column
    of B, so every partial sum is an integer multiple of one scale and stays exact in the accumulator whatever the
    summation order. ``perm`` operands put one full-mantissa value per row of A (a scaled permutation) against a
    full-mantissa B: each output is one exact product (mantissa widths add up to at most the accumulator's), so the
    multiplier's whole mantissa path is exercised. ``impl`` names the GPU path (``cublas``: ``cupy.matmul`` with
    the math mode pinned; ``mma``: our tensor-core kernel); the numpy backend runs every case through BLAS.
``alu``
    Integer multiply-add chains with shifts, rotates, bit operations, popcount and high-half multiplies.
``ieee``
    Correctly rounded IEEE operations: division, square root, fused multiply-add, and round-to-nearest-even
    conversions fp32->fp16, fp32->bf16, fp64->fp32 (inputs include exact ties).
``intrinsics``
    Fast GPU intrinsics (``__expf``, ``__sinf``, ...) whose results are defined per architecture, not by IEEE: GPU
    only, checked against per-architecture goldens recorded on reference GPUs (the numpy backend skips them, and
    ``golden generate`` cannot compute them).
``memory``
    March tests over a buffer: moving inversions, modulo-20, address-in-address, random; a failing word is read a
    second time to tell a transient read from a corrupted stored value.
``shared``
    Shared memory and atomics: per-block tree reductions and histograms, integer sums that are exact in any order.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = ["GENERATOR_VERSION", "Family", "FAMILIES", "Case", "CASES", "PORTABLE_CASES", "case_by_id", "output_dtype"]

GENERATOR_VERSION = "1"
"""Version of the input generators and reference arithmetic; recorded with every case in the manifest."""

Family = Literal["gemm", "alu", "ieee", "intrinsics", "memory", "shared"]
FAMILIES: tuple[Family, ...] = ("gemm", "alu", "ieee", "intrinsics", "memory", "shared")

# numpy dtype of each case dtype's storage (bf16, fp8 and tf32 have none: bf16 is kept as raw uint16 bits, fp8
# (OCP e4m3, "fn": no infinities) as raw uint8 bits, tf32 as float32 values whose low 13 mantissa bits are zero).
_STORAGE: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "tf32": "float32",
    "fp16": "float16",
    "bf16": "uint16",
    "fp8": "uint8",
    "u32": "uint32",
    "u64": "uint64",
}


@dataclass(frozen=True, kw_only=True)
class Case:
    """One known-answer test: what to run, on what inputs, and the shape of its output."""

    id: str
    """Stable id, ``<family>.<dtype>.<variant>`` (e.g. ``gemm.fp32.int.cublas``)."""
    family: Family
    dtype: str
    """The data type under test: ``fp64 fp32 tf32 fp16 bf16 fp8 u32 u64`` (ieee conversions name the source type)."""
    shape: tuple[int, ...]
    """Shape of the output array compared with the golden."""
    seed: int
    """Seed of the input generator; recorded with every result so a failure replays on any other device."""
    params: dict[str, Any] = field(default_factory=dict)
    """Family-specific parameters (sizes, variant, operation, GPU implementation)."""
    generator_version: str = GENERATOR_VERSION
    out_dtype: str = "float32"
    """numpy dtype of the output (``uint16`` for bf16 bits)."""
    gpu_only: bool = False
    """True for cases with per-architecture goldens (``intrinsics``): the numpy backend does not run them."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"case {self.id}: unknown family {self.family!r}")
        if not self.id.startswith(self.family + "."):
            raise ValueError(f"case id {self.id!r} must start with its family {self.family!r}")
        np.dtype(self.out_dtype)  # raises on a typo

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def size(self) -> int:
        """Number of output elements."""
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        """Size of the output in bytes."""
        return self.size * np.dtype(self.out_dtype).itemsize


def output_dtype(case: Case) -> np.dtype[Any]:
    """The numpy dtype of a case's output."""
    return np.dtype(case.out_dtype)


def storage_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype that holds values of a case dtype (bf16 -> uint16 bits, tf32 -> float32)."""
    return np.dtype(_STORAGE[dtype])


def _seed(case_id: str) -> int:
    # Seeds derive from the id so adding a case never reshuffles the others' inputs.
    return zlib.crc32(case_id.encode()) & 0x7FFFFFFF


def _gemm(dtype: str, variant: str, impl: str, *, m: int, n: int, k: int, **extra: Any) -> Case:
    cid = f"gemm.{dtype}.{variant}.{impl}"
    return Case(
        id=cid,
        family="gemm",
        dtype=dtype,
        shape=(m, n),
        seed=_seed(cid),
        params={"m": m, "n": n, "k": k, "variant": variant, "impl": impl, **extra},
        out_dtype="float64" if dtype == "fp64" else "float32",
    )


def _case(
    family: Family,
    dtype: str,
    name: str,
    shape: tuple[int, ...],
    params: dict[str, Any],
    out: str,
    gpu_only: bool = False,
) -> Case:
    """A case named ``family.dtype.name``, seeded from its id."""
    cid = f"{family}.{dtype}.{name}"
    return Case(
        id=cid,
        family=family,
        dtype=dtype,
        shape=shape,
        seed=_seed(cid),
        params=params,
        out_dtype=out,
        gpu_only=gpu_only,
    )


def _build() -> tuple[Case, ...]:
    cases: list[Case] = []
    # GEMM. Integer operands: |a|,|b| <= range, k * range**2 below 2**(accumulator bits) so sums are exact.
    cases += [
        _gemm("fp64", "int", "cublas", m=128, n=128, k=512, range=1 << 20, scale=30),
        _gemm("fp64", "perm", "cublas", m=128, n=128, k=512, bits_a=26, bits_b=27, exp=8),
        _gemm("fp32", "int", "cublas", m=128, n=128, k=1024, range=64, scale=16),
        _gemm("fp32", "perm", "cublas", m=128, n=128, k=1024, bits_a=12, bits_b=12, exp=16),
        _gemm("tf32", "int", "cublas", m=128, n=128, k=1024, range=64, scale=16),
        _gemm("tf32", "int", "mma", m=128, n=128, k=1024, range=64, scale=16),
        _gemm("tf32", "perm", "mma", m=128, n=128, k=1024, bits_a=11, bits_b=11, exp=16),
        # cuBLAS fp16 writes fp16: the exact result must itself be an fp16 value (|sum| <= 2048).
        # 16-bit operands are square-ish (k = m = n): the CPU widens them to fp32 first, O(k*(m+n)) work that a
        # long k would make dominate the O(m*n*k) product.
        _gemm("fp16", "int", "cublas", m=256, n=256, k=128, range=4, scale=2),
        _gemm("fp16", "int", "mma", m=256, n=256, k=256, range=64, scale=4),
        _gemm("fp16", "perm", "mma", m=256, n=256, k=256, bits_a=11, bits_b=11, exp=6),
        _gemm("bf16", "int", "mma", m=256, n=256, k=256, range=64, scale=16),
        _gemm("bf16", "perm", "mma", m=256, n=256, k=256, bits_a=8, bits_b=8, exp=20),
        # fp8 (e4m3) tensor cores exist from sm_89 on; their accumulation is narrower than fp32 (reports say ~14
        # bits), so the integer sums stay below 2**12.
        _gemm("fp8", "int", "mma", m=256, n=256, k=256, range=4, scale=4),
        _gemm("fp8", "perm", "mma", m=256, n=256, k=256, bits_a=4, bits_b=4, exp=4),
    ]
    # Integer ALU chains.
    for dtype, n in (("u32", 16384), ("u64", 8192)):
        out = "uint32" if dtype == "u32" else "uint64"
        cases.append(_case("alu", dtype, "chain", (n,), {"n": n, "rounds": 16}, out))
    # Correctly rounded IEEE operations.
    n = 8192
    for dtype, op, out in (
        ("fp32", "div", "float32"),
        ("fp32", "sqrt", "float32"),
        ("fp32", "fma", "float32"),
        ("fp64", "div", "float64"),
        ("fp64", "sqrt", "float64"),
        ("fp64", "fma", "float64"),
        ("fp32", "cvt_fp16", "float16"),
        ("fp32", "cvt_bf16", "uint16"),
        ("fp64", "cvt_fp32", "float32"),
    ):
        cases.append(_case("ieee", dtype, op, (n,), {"n": n, "op": op}, out))
    # Fast intrinsics: per-architecture goldens, GPU only.
    ops = ["__expf", "__logf", "__sinf", "__cosf", "__fdividef"]
    cases.append(_case("intrinsics", "fp32", "fast", (5, 4096), {"n": 4096, "ops": ops}, "float32", gpu_only=True))
    # Memory march tests (8 MiB of 32-bit words on the CPU; see CupyBackend for the GPU's share of free memory).
    words = 1 << 21
    for pattern in ("moving_inversions", "modulo20", "address", "random"):
        params = {"words": words, "pattern": pattern, "block": 131072}
        cases.append(_case("memory", "u32", pattern, (words,), params, "uint32"))
    # Shared memory and atomics.
    cases.append(_case("shared", "u32", "reduce", (3 * 256 + 2,), {"n": 65536, "block": 256, "bins": 256}, "uint32"))
    cases.append(_case("shared", "u64", "bins", (2 * 64 + 1,), {"n": 32768, "block": 256, "bins": 64}, "uint64"))
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "duplicate case id"
    return tuple(cases)


CASES: tuple[Case, ...] = _build()
"""Every case, in suite order."""

PORTABLE_CASES: tuple[Case, ...] = tuple(c for c in CASES if not c.gpu_only)
"""Cases whose golden output is defined by exact arithmetic (computed by ``sdcguard golden generate``)."""

_BY_ID = {c.id: c for c in CASES}


def case_by_id(case_id: str) -> Case:
    """The case with this id; ``KeyError`` if there is none."""
    return _BY_ID[case_id]
