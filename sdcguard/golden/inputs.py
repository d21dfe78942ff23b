"""Seeded input generators: every array a case's kernels read, rebuilt bit-for-bit from the case's seed.

Inputs are never stored (only their sha256, in the manifest): they are drawn from PCG64's raw words and shaped by
integer arithmetic alone, so every machine rebuilds the same bits. Arrays whose name starts with ``_`` are the exact
integer decompositions the reference arithmetic uses; devices see only the others.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .bits import FORMATS, e4m3_encode, raw_words
from .cases import Case, storage_dtype

__all__ = ["make_inputs", "inputs_digest", "device_inputs"]


def _ints(seed: int, stream: int, n: int, lo: int, hi: int) -> np.ndarray:
    """``n`` integers in ``[lo, hi]`` as int64 (modulo bias is irrelevant here)."""
    span = np.uint64(hi - lo + 1)
    return (raw_words(seed, stream, n) % span).astype(np.int64) + lo


def _mantissas(seed: int, stream: int, n: int, bits: int) -> np.ndarray:
    """``n`` integers with exactly ``bits`` significant bits (top bit set): full-mantissa values."""
    low = raw_words(seed, stream, n) & np.uint64((1 << (bits - 1)) - 1)
    return (low | np.uint64(1 << (bits - 1))).astype(np.int64)


def _to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """Exactly representable float64 values -> the storage of ``dtype`` (bf16: raw bits)."""
    if dtype == "bf16":
        f32 = values.astype(np.float32)
        return (f32.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    if dtype == "fp8":
        return e4m3_encode(values)
    out = values.astype(storage_dtype(dtype))
    # The generators only produce representable values: a lossy cast would be a generator bug.
    assert np.array_equal(out.astype(np.float64), values), f"values not representable in {dtype}"
    return out


def _gemm(case: Case) -> dict[str, np.ndarray]:
    p, s = case.params, case.seed
    m, n, k = p["m"], p["n"], p["k"]
    if p["variant"] == "int":
        r, sc = p["range"], p["scale"]
        a_int = _ints(s, 1, m * k, -r, r).reshape(m, k)
        b_int = _ints(s, 2, k * n, -r, r).reshape(k, n)
        ra = _ints(s, 3, m, -sc, sc)
        cb = _ints(s, 4, n, -sc, sc)
        a = np.ldexp(a_int.astype(np.float64), ra[:, None])
        b = np.ldexp(b_int.astype(np.float64), cb[None, :])
        extra = {"_a_int": a_int, "_b_int": b_int, "_ra": ra, "_cb": cb}
    else:
        ba, bb, ex = p["bits_a"], p["bits_b"], p["exp"]
        perm = np.argsort(raw_words(s, 1, k), kind="stable")[:m].astype(np.int64)
        ma = _mantissas(s, 2, m, ba) * np.where(_ints(s, 3, m, 0, 1) == 1, -1, 1)
        ea = _ints(s, 4, m, -ex, ex) - ba
        mb = (_mantissas(s, 5, k * n, bb) * np.where(_ints(s, 6, k * n, 0, 1) == 1, -1, 1)).reshape(k, n)
        eb = (_ints(s, 7, k * n, -ex, ex) - bb).reshape(k, n)
        a = np.zeros((m, k), dtype=np.float64)
        a[np.arange(m), perm] = np.ldexp(ma.astype(np.float64), ea)
        b = np.ldexp(mb.astype(np.float64), eb)
        extra = {"_perm": perm, "_ma": ma, "_ea": ea, "_mb": mb, "_eb": eb}
    return {"a": _to_storage(a, case.dtype), "b": _to_storage(b, case.dtype), **extra}


def _alu(case: Case) -> dict[str, np.ndarray]:
    s, n, rounds = case.seed, case.params["n"], case.params["rounds"]
    bits = 32 if case.dtype == "u32" else 64
    ut = np.uint32 if bits == 32 else np.uint64
    mask = np.uint64((1 << bits) - 1)
    return {
        "x": (raw_words(s, 1, n) & mask).astype(ut),
        "y": (raw_words(s, 2, n) & mask).astype(ut),
        "mul": ((raw_words(s, 3, rounds) | np.uint64(1)) & mask).astype(ut),
        "add": (raw_words(s, 4, rounds) & mask).astype(ut),
        "s1": (_ints(s, 5, rounds, 1, bits - 1)).astype(ut),
        "s2": (_ints(s, 6, rounds, 1, bits - 1)).astype(ut),
    }


def _float_bits(
    seed: int, stream: int, n: int, fmt: str, emin: int, emax: int, *, signed: bool = True, mant_bits: int | None = None
) -> np.ndarray:
    """Random normal values of ``fmt`` (fp32 or fp64) as float64: exponent in [emin, emax], full mantissa."""
    p = FORMATS[fmt][0] if mant_bits is None else mant_bits
    m = _mantissas(seed, stream, n, p)
    e = _ints(seed, stream + 100, n, emin, emax) - (p - 1)
    v = np.ldexp(m.astype(np.float64), e)
    if signed:
        v = np.where(_ints(seed, stream + 200, n, 0, 1) == 1, -v, v)
    return v


def _with_ties(seed: int, values: np.ndarray, precision: int, dropped: int, stream: int) -> np.ndarray:
    """Turn a quarter of ``values`` (``precision``-bit floats held as float64) into exact halfway cases for a
    rounding that drops the ``dropped`` low significand bits."""
    n = len(values)
    pick = _ints(seed, stream, n, 0, 3) == 0
    frac, exp = np.frexp(values[pick])
    num = np.abs(np.ldexp(frac, precision)).astype(np.int64)  # exactly `precision` bits, top bit set
    num = (num >> dropped << dropped) | (1 << (dropped - 1))  # keep the top bits, then exactly half an ulp
    out = values.copy()
    out[pick] = np.copysign(np.ldexp(num.astype(np.float64), exp - precision), values[pick])
    return out


def _ieee(case: Case) -> dict[str, np.ndarray]:
    s, n, op = case.seed, case.params["n"], case.params["op"]
    f32 = case.dtype == "fp32"
    dt = np.float32 if f32 else np.float64
    if op == "div":
        r = 20 if f32 else 100
        a, b = _float_bits(s, 1, n, case.dtype, -r, r), _float_bits(s, 2, n, case.dtype, -r, r)
        return {"a": a.astype(dt), "b": b.astype(dt)}
    if op == "sqrt":
        r = 40 if f32 else 200
        return {"a": _float_bits(s, 1, n, case.dtype, -r, r, signed=False).astype(dt)}
    if op == "fma":
        if f32:
            a = _float_bits(s, 1, n, "fp32", -10, 10)
            b = _float_bits(s, 2, n, "fp32", -10, 10)
            # |c| within 2**-4..2**3 of |a*b|: the exact a*b+c spans <= 53 bits (a float64 add rounds only once).
            shift = _ints(s, 3, n, -4, 3)
        else:
            a = _float_bits(s, 1, n, "fp64", -30, 30, mant_bits=26)  # a*b exact in float64
            b = _float_bits(s, 2, n, "fp64", -30, 30, mant_bits=27)
            shift = _ints(s, 3, n, -60, 10)
        c = _float_bits(s, 4, n, case.dtype, 0, 0)
        ab_exp = np.frexp(a * b)[1]
        c = np.ldexp(c, ab_exp + shift)
        return {"a": a.astype(dt), "b": b.astype(dt), "c": c.astype(dt)}
    if op == "cvt_fp16":
        v = _with_ties(s, _float_bits(s, 1, n, "fp32", -14, 14), 24, 13, 5)
        return {"a": v.astype(np.float32)}
    if op == "cvt_bf16":
        v = _with_ties(s, _float_bits(s, 1, n, "fp32", -100, 100), 24, 16, 5)
        return {"a": v.astype(np.float32)}
    if op == "cvt_fp32":
        v = _with_ties(s, _float_bits(s, 1, n, "fp64", -100, 100), 53, 29, 5)
        return {"a": v.astype(np.float64)}
    raise ValueError(f"unknown ieee op {op!r}")


def _intrinsics(case: Case) -> dict[str, np.ndarray]:
    s, n = case.seed, case.params["n"]
    u = (raw_words(s, 1, n) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    w = (raw_words(s, 2, n) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return {"x": (u * 16.0 - 8.0).astype(np.float32), "y": (w * 99.0 + 1.0).astype(np.float32)}


def _memory(case: Case) -> dict[str, np.ndarray]:
    s = case.seed
    words = raw_words(s, 1, 4)
    return {
        "pattern": (words[:1] & np.uint64(0xFFFFFFFF)).astype(np.uint32),
        "salt": (words[1:2] & np.uint64(0xFFFFFFFF)).astype(np.uint32),
        "offsets": (words[2:4] % np.uint64(20)).astype(np.uint32),
    }


def _shared(case: Case) -> dict[str, np.ndarray]:
    s, n = case.seed, case.params["n"]
    w = raw_words(s, 1, n)
    return {"x": (w & np.uint64(0xFFFFFFFF)).astype(np.uint32) if case.dtype == "u32" else w}


_GENERATORS = {
    "gemm": _gemm,
    "alu": _alu,
    "ieee": _ieee,
    "intrinsics": _intrinsics,
    "memory": _memory,
    "shared": _shared,
}


def make_inputs(case: Case) -> dict[str, np.ndarray]:
    """Every input array of ``case`` (device inputs and ``_``-prefixed reference decompositions)."""
    return _GENERATORS[case.family](case)


def device_inputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a device reads (no ``_`` reference-only entries), contiguous."""
    return {k: np.ascontiguousarray(v) for k, v in inputs.items() if not k.startswith("_")}


def inputs_digest(inputs: dict[str, np.ndarray]) -> str:
    """sha256 over the device inputs (name, dtype, shape, bytes), recorded in the manifest."""
    h = hashlib.sha256()
    for name, a in sorted(device_inputs(inputs).items()):
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.data)
    return h.hexdigest()
