"""Exact reference arithmetic: the golden output of every portable case.

This is what ``sdcguard golden generate`` writes and ``verify`` recomputes. It uses integer arithmetic (numpy int64
and uint64 with explicit masks, Python integers for rounding and 64-bit products) and float64 only for conversions
that are exact by construction; it never runs the operation under test the way a device does (no BLAS, no float
division or square root, no float16 casts of inexact values).
"""

from __future__ import annotations

from math import isqrt

import numpy as np

from .bits import FORMATS, compose, decompose, round_exact
from .cases import Case

__all__ = ["reference_output", "alu_round_constants", "memory_pattern"]

_M32 = (1 << 32) - 1
_M64 = (1 << 64) - 1


def _exact_cast(values: np.ndarray, out_dtype: str) -> np.ndarray:
    out = values.astype(out_dtype)
    if not np.array_equal(out.astype(np.float64), values):
        raise AssertionError(f"reference value not exactly representable in {out_dtype}: generator bug")
    return out


def _gemm(case: Case, inp: dict[str, np.ndarray]) -> np.ndarray:
    if case.params["variant"] == "int":
        acc = inp["_a_int"] @ inp["_b_int"]  # int64, exact (|acc| <= k * range**2 < 2**53)
        assert int(np.abs(acc).max()) < (1 << 53)
        vals = np.ldexp(acc.astype(np.float64), inp["_ra"][:, None] + inp["_cb"][None, :])
    else:
        perm = inp["_perm"]
        prod = inp["_ma"][:, None] * inp["_mb"][perm, :]  # int64, exact: bits_a + bits_b <= 53
        vals = np.ldexp(prod.astype(np.float64), inp["_ea"][:, None] + inp["_eb"][perm, :])
    return _exact_cast(vals, case.out_dtype)


def _popcount_u64(x: np.ndarray) -> np.ndarray:
    # byte table: a different path from the hardware popcount the devices use
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint64)
    total = np.zeros_like(x)
    for shift in range(0, 64, 8):
        total += table[(x >> np.uint64(shift)) & np.uint64(0xFF)]
    return total


def alu_round_constants(inp: dict[str, np.ndarray], r: int) -> tuple[int, int, int, int]:
    """``(mul, add, s1, s2)`` of round ``r`` as Python ints."""
    return int(inp["mul"][r]), int(inp["add"][r]), int(inp["s1"][r]), int(inp["s2"][r])


def _alu(case: Case, inp: dict[str, np.ndarray]) -> np.ndarray:
    rounds = case.params["rounds"]
    if case.dtype == "u32":
        # uint64 lanes with explicit 32-bit masks (the devices wrap in 32-bit registers)
        m = np.uint64(_M32)
        x = inp["x"].astype(np.uint64)
        y = inp["y"].astype(np.uint64)
        for r in range(rounds):
            mul, add, s1, s2 = (np.uint64(v) for v in alu_round_constants(inp, r))
            x = (x * mul + add) & m
            x = x ^ (x >> s1)
            x = ((x << s2) | (x >> (np.uint64(32) - s2))) & m
            x = (x + _popcount_u64(x ^ y)) & m
            x = x ^ ((x * mul) >> np.uint64(32))
            y = (y & (~x & m)) | (x & add)
        return ((x ^ y) & m).astype(np.uint32)
    return _alu_u64(inp, rounds)


def _alu_u64(inp: dict[str, np.ndarray], rounds: int) -> np.ndarray:
    """The u64 ALU case in Python integers: exact 128-bit products for the high half."""
    xs = [int(v) for v in inp["x"]]
    ys = [int(v) for v in inp["y"]]
    for r in range(rounds):
        mul, add, s1, s2 = alu_round_constants(inp, r)
        for i in range(len(xs)):
            x, y = xs[i], ys[i]
            x = (x * mul + add) & _M64
            x ^= x >> s1
            x = ((x << s2) | (x >> (64 - s2))) & _M64
            x = (x + (x ^ y).bit_count()) & _M64
            x ^= (x * mul) >> 64
            y = (y & ~x & _M64) | (x & add)
            xs[i], ys[i] = x, y
    return np.array([x ^ y for x, y in zip(xs, ys)], dtype=np.uint64)


def _div(a: float, b: float, p: int) -> float:
    sa, ma, ea = decompose(a)
    sb, mb, eb = decompose(b)
    q, e = round_exact(ma, mb, ea - eb, p)
    return compose(sa ^ sb, q, e)


def _sqrt(a: float, p: int) -> float:
    _, m, e = decompose(a)
    if e % 2:
        m, e = m << 1, e - 1
    # scale by 4**t so the integer square root carries at least p + 2 bits, then round the surplus away
    t = max(0, p + 2 - m.bit_length() // 2)
    n = m << (2 * t)
    root = isqrt(n)
    drop = root.bit_length() - p
    q, rest = root >> drop, root & ((1 << drop) - 1)
    half = 1 << (drop - 1)
    inexact = root * root != n
    if rest > half or (rest == half and (inexact or q & 1)):
        q += 1
    return compose(0, q, e // 2 - t + drop)


def _fma(a: float, b: float, c: float, p: int) -> float:
    sa, ma, ea = decompose(a)
    sb, mb, eb = decompose(b)
    sc, mc, ec = decompose(c)
    e = min(ea + eb, ec)
    prod = (ma * mb) << (ea + eb - e)
    addend = mc << (ec - e)
    total = (-prod if sa ^ sb else prod) + (-addend if sc else addend)
    if total == 0:
        return 0.0  # round-to-nearest: an exact zero sum of non-zero terms is +0
    q, e2 = round_exact(abs(total), 1, e, p)
    return compose(1 if total < 0 else 0, q, e2)


def _convert(a: float, p: int) -> float:
    s, m, e = decompose(a)
    q, e2 = round_exact(m, 1, e, p)
    return compose(s, q, e2)


def _ieee(case: Case, inp: dict[str, np.ndarray]) -> np.ndarray:
    op = case.params["op"]
    if op in ("div", "sqrt", "fma"):
        p = FORMATS[case.dtype][0]
        a = inp["a"].tolist()
        if op == "div":
            vals = [_div(x, y, p) for x, y in zip(a, inp["b"].tolist())]
        elif op == "sqrt":
            vals = [_sqrt(x, p) for x in a]
        else:
            vals = [_fma(x, y, z, p) for x, y, z in zip(a, inp["b"].tolist(), inp["c"].tolist())]
        return _exact_cast(np.array(vals, dtype=np.float64), case.out_dtype)
    target = {"cvt_fp16": "fp16", "cvt_bf16": "bf16", "cvt_fp32": "fp32"}[op]
    vals_arr = np.array([_convert(x, FORMATS[target][0]) for x in inp["a"].tolist()], dtype=np.float64)
    if target == "bf16":
        f32 = _exact_cast(vals_arr, "float32")
        return (f32.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return _exact_cast(vals_arr, case.out_dtype)


def memory_pattern(case: Case, inp: dict[str, np.ndarray], index: np.ndarray) -> np.ndarray:
    """The word every index must hold after the case's march (uint32), computed in masked uint64 arithmetic."""
    m = np.uint64(_M32)
    i = index.astype(np.uint64)
    p = np.uint64(int(inp["pattern"][0]))
    salt = np.uint64(int(inp["salt"][0]))
    kind = case.params["pattern"]
    if kind == "moving_inversions":
        out = np.full(i.shape, p, dtype=np.uint64)
    elif kind == "modulo20":
        last = np.uint64(int(inp["offsets"][-1]))
        out = np.where(i % np.uint64(20) == last, p, ~p & m)
    elif kind == "address":
        out = ~((i * np.uint64(4) + salt) & m) & m
    elif kind == "random":
        x = (i * np.uint64(0x9E3779B1) + salt) & m
        x ^= x >> np.uint64(16)
        x = (x * np.uint64(0x85EBCA6B)) & m
        x ^= x >> np.uint64(13)
        x = (x * np.uint64(0xC2B2AE35)) & m
        x ^= x >> np.uint64(16)
        out = ~x & m
    else:
        raise ValueError(f"unknown memory pattern {kind!r}")
    return out.astype(np.uint32)


def _memory(case: Case, inp: dict[str, np.ndarray]) -> np.ndarray:
    return memory_pattern(case, inp, np.arange(case.params["words"], dtype=np.uint64))


def _shared(case: Case, inp: dict[str, np.ndarray]) -> np.ndarray:
    block, bins = case.params["block"], case.params["bins"]
    x = inp["x"]
    if case.dtype == "u32":
        w = x.astype(np.uint64).reshape(-1, block)
        sums = w.sum(axis=1) & np.uint64(_M32)
        xors = np.bitwise_xor.reduce(w, axis=1)
        keys, counts = np.unique(x >> np.uint32(24), return_counts=True)
        hist = np.zeros(bins, dtype=np.uint64)
        hist[keys.astype(np.int64)] = counts.astype(np.uint64)
        total = np.array([int(w.sum()) & _M32, int(np.bitwise_xor.reduce(x.astype(np.uint64)))], dtype=np.uint64)
        return np.concatenate([sums, xors, hist, total]).astype(np.uint32)
    sums_i = [0] * bins
    counts_i = [0] * bins
    xor = 0
    for v in x.tolist():
        k = v >> 58
        sums_i[k] = (sums_i[k] + v) & _M64
        counts_i[k] += 1
        xor ^= v
    return np.array(sums_i + counts_i + [xor], dtype=np.uint64)


_REFERENCES = {"gemm": _gemm, "alu": _alu, "ieee": _ieee, "memory": _memory, "shared": _shared}


def reference_output(case: Case, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The exact expected output of a portable case (``ValueError`` for per-architecture ``intrinsics``)."""
    if case.gpu_only:
        raise ValueError(f"{case.id}: golden output is per GPU architecture, not computable by reference arithmetic")
    out = _REFERENCES[case.family](case, inputs)
    assert out.shape == case.shape and out.dtype == np.dtype(case.out_dtype), (case.id, out.shape, out.dtype)
    return out
