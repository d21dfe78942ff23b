"""The numpy implementations of every portable family: what a CPU core computes in the numpy backend.

Each runner takes the case, its (read-only) inputs and a per-case scratch dict the backend keeps between runs,
and returns the output array plus, for memory marches, the first word that failed a read check during the march
(``None`` when every read matched). The outputs must equal the golden bit for bit on a healthy core: GEMM
operands are exact in any summation order, and the IEEE operations numpy calls are correctly rounded on x86-64 and
aarch64 (SSE/AVX and NEON division, square root and conversions round to nearest even).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .bits import e4m3_table, same_bytes
from .cases import Case

__all__ = ["MarchError", "RUNNERS", "march_words", "traffic_bytes", "flops"]

_U32 = np.uint32
_U64 = np.uint64


@dataclass(frozen=True, kw_only=True)
class MarchError:
    """The first word of a memory march whose read did not return what was written."""

    element: int
    expected: int
    actual: int
    second_read: int
    """The same word read again right away: equal to ``expected`` means a transient read, not a stored error."""
    phase: str
    count: int
    """Failing words found in that read pass."""


Scratch = dict[Any, Any]
Runner = Callable[[Case, dict[str, np.ndarray], Scratch], tuple[np.ndarray, MarchError | None]]


def _as_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        return a.astype(np.float32)  # F16C conversion units
    if dtype == "bf16":
        return (a.astype(_U32) << _U32(16)).view(np.float32)
    if dtype == "fp8":
        return np.take(e4m3_table(), a)  # numpy has no fp8: decode by table
    return a


def _gemm(case: Case, inp: dict[str, np.ndarray], scratch: Scratch) -> tuple[np.ndarray, None]:
    out = scratch.get("out")
    if out is None:
        out = scratch["out"] = np.empty(case.shape, dtype=case.out_dtype)
    np.matmul(_as_f32(inp["a"], case.dtype), _as_f32(inp["b"], case.dtype), out=out)
    return out, None


def _mulhi64(x: np.ndarray, m: np.uint64) -> np.ndarray:
    lo32 = _U64(0xFFFFFFFF)
    s32 = _U64(32)
    x_lo, x_hi = x & lo32, x >> s32
    m_lo, m_hi = m & lo32, m >> s32
    lo_lo = x_lo * m_lo
    hi_lo = x_hi * m_lo
    lo_hi = x_lo * m_hi
    cross = (lo_lo >> s32) + (hi_lo & lo32) + lo_hi
    return x_hi * m_hi + (hi_lo >> s32) + (cross >> s32)


def _alu(case: Case, inp: dict[str, np.ndarray], scratch: Scratch) -> tuple[np.ndarray, None]:
    wide = case.dtype == "u64"
    t = _U64 if wide else _U32
    bits = t(64 if wide else 32)
    x = inp["x"].copy()
    y = inp["y"].copy()
    for r in range(case.params["rounds"]):
        mul, add, s1, s2 = inp["mul"][r], inp["add"][r], inp["s1"][r], inp["s2"][r]
        x *= mul
        x += add
        x ^= x >> s1
        x = (x << s2) | (x >> (bits - s2))
        x += np.bitwise_count(x ^ y).astype(t)
        x ^= _mulhi64(x, mul) if wide else ((x.astype(_U64) * _U64(mul)) >> _U64(32)).astype(_U32)
        y = (y & ~x) | (x & add)
    return x ^ y, None


def _ieee(case: Case, inp: dict[str, np.ndarray], scratch: Scratch) -> tuple[np.ndarray, None]:
    op = case.params["op"]
    if op == "div":
        return np.divide(inp["a"], inp["b"]), None
    if op == "sqrt":
        return np.sqrt(inp["a"]), None
    if op == "fma":
        if case.dtype == "fp32":
            # the exact a*b+c fits a float64 (generator's guarantee): one rounding, in the cast
            wide = inp["a"].astype(np.float64) * inp["b"].astype(np.float64) + inp["c"].astype(np.float64)
            return wide.astype(np.float32), None
        return inp["a"] * inp["b"] + inp["c"], None  # a*b is exact (26- and 27-bit mantissas): one rounding
    if op == "cvt_fp16":
        return inp["a"].astype(np.float16), None
    if op == "cvt_bf16":
        u = inp["a"].view(_U32)
        return ((u + _U32(0x7FFF) + ((u >> _U32(16)) & _U32(1))) >> _U32(16)).astype(np.uint16), None
    if op == "cvt_fp32":
        return inp["a"].astype(np.float32), None
    raise ValueError(op)


def _check(blk: np.ndarray, expect: np.ndarray, base: int, phase: str, buf: np.ndarray) -> MarchError | None:
    """Read ``blk`` back and compare it with ``expect`` (same length). The fast path is one memcmp."""
    if blk.flags.c_contiguous and same_bytes(blk, expect):
        return None
    ok = blk == expect
    if ok.all():
        return None
    bad = np.flatnonzero(~ok)
    i = int(bad[0])
    exp, actual = int(expect[i]), int(blk[i])
    second = int(buf[base + i])  # a fresh read of the same word
    return MarchError(
        element=base + i, expected=exp, actual=actual, second_read=second, phase=phase, count=int(bad.size)
    )


def march_words(kind: str, index: np.ndarray, base: int, salt: np.uint32, *, out: np.ndarray) -> np.ndarray:
    """The final contents of words ``base + index`` of an address-in-address or random march, computed by the
    march itself in wrapping 32-bit arithmetic: a formulation of its own, independent of the reference
    arithmetic's (masked 64-bit, :func:`sdcguard.golden.reference.memory_pattern`), so a bug in either shows up
    against the golden instead of cancelling out."""
    np.add(index, _U32(base & 0xFFFFFFFF), out=out)
    if kind == "address":
        np.left_shift(out, _U32(2), out=out)
        np.add(out, salt, out=out)
        return np.invert(out, out=out)
    np.multiply(out, _U32(0x9E3779B1), out=out)
    np.add(out, salt, out=out)
    for shift, mul in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        np.bitwise_xor(out, out >> _U32(shift), out=out)
        np.multiply(out, _U32(mul), out=out)
    np.bitwise_xor(out, out >> _U32(16), out=out)
    return np.invert(out, out=out)


def _memory(case: Case, inp: dict[str, np.ndarray], scratch: Scratch) -> tuple[np.ndarray, MarchError | None]:
    """The march over ``scratch["buf"]``; the final contents are what the golden compare checks.

    Address-in-address and random marches compute their words block by block on every run
    (:func:`march_words`), never from the golden they are then compared with: a pattern computed wrong, by a
    bug or by the core, is a failed execution.
    """
    words, block, kind = case.params["words"], case.params["block"], case.params["pattern"]
    buf = scratch.get("buf")
    if buf is None:
        buf = scratch["buf"] = np.empty(words, dtype=_U32)
        p = _U32(inp["pattern"][0])
        # one block of p, of ~p, and a work block, next to the block under test in cache
        scratch["p"] = np.full(block, p, dtype=_U32)
        scratch["q"] = np.full(block, ~p, dtype=_U32)
        scratch["tmp"] = np.empty(block, dtype=_U32)
    starts = range(0, words, block)
    first: MarchError | None = None

    def note(err: MarchError | None) -> None:
        nonlocal first
        if err is not None and first is None:
            first = err

    pblk, qblk = scratch["p"], scratch["q"]
    p, q = pblk[0], qblk[0]
    if kind == "moving_inversions":
        buf.fill(p)
        for s in starts:  # ascending: read p, write ~p
            blk = buf[s : s + block]
            note(_check(blk, pblk[: len(blk)], s, "ascending", buf))
            blk.fill(q)
        for s in reversed(starts):  # descending: read ~p, write p
            blk = buf[s : s + block]
            note(_check(blk, qblk[: len(blk)], s, "descending", buf))
            blk.fill(p)
    elif kind == "modulo20":
        for off in (int(o) for o in inp["offsets"]):
            buf.fill(q)
            view = buf[off::20]
            view[...] = p
            expect = scratch.get(("p", len(view)))
            if expect is None:
                expect = scratch[("p", len(view))] = np.full(len(view), p, dtype=_U32)
            err = _check(view, expect, 0, f"modulo20+{off}", view)
            if err is not None:  # indices were relative to the strided view: map back to word indices
                err = MarchError(
                    element=off + 20 * err.element,
                    expected=err.expected,
                    actual=err.actual,
                    second_read=err.second_read,
                    phase=err.phase,
                    count=err.count,
                )
            note(err)
    else:
        tmp, fin = scratch["tmp"], scratch.setdefault("fin", np.empty(block, dtype=_U32))
        index = scratch.setdefault("index", np.arange(block, dtype=_U32))
        salt = _U32(inp["salt"][0])
        for s in starts:  # write the pattern, block by block
            blk = buf[s : s + block]
            np.invert(march_words(kind, index[: len(blk)], s, salt, out=fin[: len(blk)]), out=blk)
        for s in starts:  # read it back, write its inverse (the final contents)
            blk = buf[s : s + block]
            words = march_words(kind, index[: len(blk)], s, salt, out=fin[: len(blk)])
            pat = np.invert(words, out=tmp[: len(blk)])
            note(_check(blk, pat, s, "ascending", buf))
            np.copyto(blk, words)
    return buf, first


def _shared(case: Case, inp: dict[str, np.ndarray], scratch: Scratch) -> tuple[np.ndarray, None]:
    x = inp["x"]
    block, bins = case.params["block"], case.params["bins"]
    if case.dtype == "u32":
        blocks = x.reshape(-1, block)
        return np.concatenate(
            [
                blocks.sum(axis=1, dtype=_U32),
                np.bitwise_xor.reduce(blocks, axis=1),
                np.bincount(x >> _U32(24), minlength=bins).astype(_U32),
                np.array([x.sum(dtype=_U32), np.bitwise_xor.reduce(x)], dtype=_U32),
            ]
        ), None
    keys = (x >> _U64(58)).astype(np.intp)
    sums = np.zeros(bins, dtype=_U64)
    np.add.at(sums, keys, x)
    counts = np.bincount(keys, minlength=bins).astype(_U64)
    return np.concatenate([sums, counts, np.array([np.bitwise_xor.reduce(x)], dtype=_U64)]), None


RUNNERS: dict[str, Runner] = {"gemm": _gemm, "alu": _alu, "ieee": _ieee, "memory": _memory, "shared": _shared}


def traffic_bytes(case: Case) -> int:
    """Bytes of the buffer under test a run reads plus writes (the march and the final compare)."""
    n = case.params["words"] * 4
    kind = case.params["pattern"]
    if kind == "moving_inversions":
        return n * 6  # fill, (read+write) x2, final read
    if kind == "modulo20":
        return len(case.params.get("offsets", (0, 0))) * (n + n // 20 + n // 20) + n
    return n * 4  # write, read, write, final read


def flops(case: Case) -> int:
    """Floating-point operations of a GEMM case (2*m*n*k)."""
    p = case.params
    return 2 * p["m"] * p["n"] * p["k"]
