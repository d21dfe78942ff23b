"""The checksum identity of a matmul and a rigorous bound on its rounding error: does a computed product hold?

For ``C = A @ B`` (``A``: m x k, ``B``: k x n; batched alike) the identity ``e_G^T (A B) = (e_G^T A) B`` holds exactly
for the indicator ``e_G`` of every block ``G`` of ``b`` consecutive rows. :func:`check_matmul` compares the column
sums of each row block of the computed ``C`` with the same sums computed from the operands (two small matmuls,
``2/b`` of the matmul's work, plus one read of ``A`` and ``C``) and counts the block columns whose difference
exceeds the bound below. It reads its inputs only; nothing it computes reaches the training step.

Notation: ``u`` the unit roundoff of the precision named, ``gamma(n) = n u / (1 - n u)``, ``|X|`` elementwise,
``M = |e_G^T A| ... `` below means ``Mag = (e_G^T |A|) |B|`` (plus ``|bias|`` terms), the sum over the block's
entries of ``sum_l |A_il| |B_lj|``. The computation being checked is modelled by three units (:class:`Precision`):
``u_in`` (each operand rounded before the products: TF32 or bf16 internal precision of an fp32 matmul, else 0),
``u_acc`` (the accumulation: fp32, or the operands' own precision where reduced-precision reductions are allowed)
and ``u_out`` (the rounding of the result to the output dtype: bf16, fp16; 0 for fp32).

**Theorem.** For every computed ``C^`` that the backend produces by any order of summation of the ``k' = k (+1 with
a bias)`` products, ``|S - R| <= beta * Mag + eta`` for every block column, where ``S`` is the computed block sum of
``C^``, ``R`` the computed reference and ``beta = alpha + gamma_w(b)(2 + alpha) + (gamma_w(k') + theta)(1 +
gamma_w(b))``, ``alpha = (1 + u_out)(gamma_acc(k') + th_in (1 + gamma_acc(k'))) + u_out``, ``th_in = 2 u_in +
u_in^2``, ``theta`` the same for the check's own fp32 matmuls and ``eta`` the absolute underflow terms.

*Proof.* (1) Each product ``a b`` of rounded operands is ``a b (1 + t)``, ``|t| <= th_in``; a sum of ``k'`` terms
in any order with ``u_acc`` has error at most ``gamma_acc(k')`` times the sum of the terms' magnitudes (Higham,
*Accuracy and Stability*, 3.1; an FMA only removes roundings); rounding to the output adds ``u_out`` of the
result. So ``|C^_ij - (AB)_ij| <= alpha sum_l |A_il||B_lj|`` and ``|C^_ij| <= (1 + alpha) sum_l |A_il||B_lj|``.
(2) The block sum ``S`` of ``b`` terms in the check's precision ``w`` errs by at most ``gamma_w(b) sum |C^| <=
gamma_w(b)(1 + alpha) Mag``, and ``sum_G C^ = e_G^T A B + E`` with ``|E| <= alpha Mag``. (3) The computed ``V^ =
e_G^T A + dV``, ``|dV| <= gamma_w(b) e_G^T|A|``, so ``|dV B| <= gamma_w(b) Mag`` and ``|V^| <= (1 + gamma_w(b))
e_G^T|A|``; ``R = fl(V^ B)`` errs from ``V^ B`` by at most ``(gamma_w(k') + theta(1 + gamma_w(k'))) |V^||B|``.
(4) ``e_G^T A B = (e_G^T A) B`` exactly, so the triangle inequality over (2)-(3) gives ``beta Mag``. (5) ``Mag``
itself is computed from non-negative terms, so the computed value is at least ``(1 - gamma_w(b))(1 -
gamma_w(k'))(1 - theta)`` times the true one: dividing by that factor bounds the true ``Mag`` from above. (6)
Underflow adds at most the smallest normal number of each precision per rounding (flush-to-zero included) and,
where inputs are flushed, ``tiny_in |other operand|`` per product: ``eta``. (7) Evaluating ``|S - R|`` and the bound
takes a handful of roundings in ``w``; the factor ``1 + 2**-10`` covers them. A block column whose ``Mag`` is not
finite or could reach the output's overflow threshold is not judged (a legitimate overflow is possible there); in
every other column an infinite or NaN ``C^`` entry is impossible, so any NaN/Inf difference is a fault. QED.

(8) *The screen: most columns need no magnitudes*, and whether a column needs them is decided from the operands
alone. Computing ``Mag`` is a second small matmul and a pass over ``|A|`` and ``|B|``; three lower bounds of it cost
far less. (a) By (3), ``|R| <= |V^||B| (1 + gamma_w(k') + theta (1 + gamma_w(k'))) <= (1 + rho) Mag`` with ``rho =
gamma_w(b) + (gamma_w(k') + theta (1 + gamma_w(k'))) (1 + gamma_w(b)) <= beta`` (the bias as the ``k'``-th term).
(b) ``|V_l| = |sum_{i in G} A_il| <= (e_G^T|A|)_l`` and by (3) ``|V^_l| <= |V_l| + gamma_w(b) (e_G^T|A|)_l``, so
``L = sum_l |V^_l||B_lj|`` (plus the block's rows times ``|bias_j|``), computed with ``k' + 1`` roundings, is at
most ``(1 + gamma_w(b))(1 + gamma_w(k' + 2)) Mag``. (c) So is ``M``, the same sum with the computed block sums of
``|A|`` in place of ``|V^|`` (each at most ``(1 + gamma_w(b)) (e_G^T|A|)_l``): one column's magnitudes computed on
their own. Hence ``|S - R| <= c_R |R|`` with ``c_R = beta (1 - 2**-10)**2 / (1 + beta)``, or ``|S - R| <= c_V L``
or ``<= c_V M`` with ``c_V = beta (1 - 2**-10)**2 / ((1 + gamma_w(b))(1 + gamma_w(k' + 2)))``, gives ``|S - R| <=
beta (1 - 2**-10) Mag`` (one factor ``1 - 2**-10`` absorbs the rounding of ``c |R|``, ``c L`` or ``c M``), and the
computed bound of the theorem is at least ``beta Mag (1 - u_w)^2`` (underflow in ``R``, ``L`` or ``M`` stays within
``eta``): the column passes the full check. ``R``, ``L`` and ``M`` are computed from the operands only, so this
holds for **every** ``C^``, corrupted or not. A NaN in ``|S - R|`` or in the lower bound fails the comparison; an
infinite lower bound is excluded (``|S - R| <= inf`` would hold). So when every column is cleared the count is 0,
exactly what the full check returns; otherwise the full check runs: the count is the same either way, for any
``C^``. (a) is free (``R`` is at hand) and clears nearly every column on clean steps (99% of the benchmark
transformer's: ``|R|`` is about the column's sum, the rest cancel); (b) is computed only for the columns (a) left,
``k`` products each, and cancels over rows only; (c) (a pass over ``|A|``, then ``k`` products per column) only for
the columns (b) left, where ``V^`` itself cancels (the gradient of a softmax's input sums to zero over a row). A
screen on the computed ``C^`` (its largest ``|C^|`` bounds ``Mag`` from below when ``C^`` is correct) was used
before and is not: a fault that raises an entry raises that bound with it, and two corrupted entries of one block
column whose errors nearly cancel were cleared while the full check flagged them (a test keeps that case).

*The engine.* On the CPU, for fp32 and bf16 operands, the block sums of ``A`` and ``C`` (and of ``|A|`` when tier (c)
is reached) and the three tiers run in a C engine (``sdcguard/training/checksums/_core.c``, an optional extension
built at install; without it the same steps run as torch ops): each operand is read once in its memory order and
the tiers take one pass over each block's columns. Its sums are fp32 in another order (within the ``gamma_w(b)`` of
(2)-(3), whatever the order); it computes ``L`` and ``M`` either in double or, for all of a block's columns at once
along ``B``'s contiguous rows (vectorized across columns), in fp32 (each column's sum in ``l`` order: the ``k' + 1``
roundings of the fp32 evaluation (8) allows for), and the comparisons in double, so the proof holds as written.
bf16 results leave about a fifth of the columns to tier (b) (the output rounding is a larger share of ``|R|``; fp32:
0.5%). The full check uses the same sums as the screen, so the count is the same with or without the screen here
too.

Consequences (what is caught): a changed entry ``C^_ij -> C^_ij + d`` is caught when ``|d| > 2 beta Mag`` in its
block column, whatever its bits. Sign flips and exponent flips of entries not far below the column's typical
magnitude, NaN and Inf always exceed it; flips of the low mantissa bits never do (they are below the rounding
noise, and left to replay). The bound grows with ``b`` (``rows``): fewer rows per checksum catch smaller errors for
more work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

try:  # built at install where a C compiler was present; without it the same screen runs as torch ops
    from . import _core as _checksum_core
except ImportError:  # pragma: no cover - depends on the install
    _checksum_core = None  # type: ignore[assignment]  # (the stub types the built module)

__all__ = ["Precision", "precision_for", "check_matmul", "DEFAULT_ROWS", "c_engine_available"]

DEFAULT_ROWS = 32
"""Rows of the result summed per checksum (``b``): the check costs ``2/b`` of the matmul's multiply-adds."""

_SLACK = 1.0 + 2.0**-10
_UNITS = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@dataclass(frozen=True)
class Precision:
    """Unit roundoffs of one matmul as the backend computes it (see the module docstring)."""

    u_in: float
    """Operand rounding before the products (TF32: 2**-10, bf16 internal precision: 2**-7, truncation allowed
    for; else 0)."""
    u_acc: float
    """Accumulation unit (fp32: 2**-24; the operands' own unit with reduced-precision reductions)."""
    u_out: float
    """Rounding of the result to the output dtype (0 when the output is the accumulation dtype)."""
    u_ref: float
    """Operand rounding of the check's own fp32 matmuls (the same setting as ``u_in`` of an fp32 matmul)."""
    tiny_out: float = 0.0
    """Smallest normal number of the output dtype (each output rounding may flush up to it)."""
    tiny_in: float = 0.0
    """Smallest normal number of the operands (a flushed operand loses up to it times the other)."""


def _fp32_internal(device_type: str) -> str:
    """How an fp32 matmul rounds its operands under the current settings: ``highest`` (not at all), ``high``
    (TF32) or ``medium`` (bf16)."""
    mode = torch.get_float32_matmul_precision()
    if device_type == "cuda" and mode == "highest" and torch.backends.cuda.matmul.allow_tf32:
        mode = "high"
    return mode


def precision_for(dtype: torch.dtype, device: torch.device) -> Precision | None:
    """The :class:`Precision` of a matmul of ``dtype`` operands on ``device``; None for a dtype it cannot bound.
    Read from the current settings on every call (they may change between steps); the arithmetic is cached."""
    reduced = False
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        matmul = torch.backends.cuda.matmul
        reduced = (
            matmul.allow_bf16_reduced_precision_reduction
            if dtype == torch.bfloat16
            else matmul.allow_fp16_reduced_precision_reduction
        )
    return _precision(dtype, _fp32_internal(device.type), reduced)


@functools.lru_cache(maxsize=64)
def _precision(dtype: torch.dtype, mode: str, reduced: bool) -> Precision | None:
    """TF32 keeps 10 mantissa bits of an fp32 operand and truncation instead of rounding is allowed for (2**-10,
    not 2**-11); bf16 internal precision keeps 7. ``reduced``: reduced-precision reductions of bf16/fp16."""
    if dtype not in _UNITS:
        return None
    ref = {"highest": 0.0, "high": 2.0**-10}.get(mode, 2.0**-7)
    tiny = torch.finfo(dtype).tiny
    if dtype in (torch.float32, torch.float64):
        return Precision(
            u_in=ref if dtype == torch.float32 else 0.0,
            u_acc=_UNITS[dtype],
            u_out=0.0,
            u_ref=ref,
            tiny_out=tiny,
            tiny_in=tiny,
        )
    return Precision(
        u_in=0.0,
        u_acc=_UNITS[dtype] if reduced else _UNITS[torch.float32],
        u_out=_UNITS[dtype],
        u_ref=ref,
        tiny_out=tiny,
        tiny_in=tiny,
    )


def _gamma(n: int, u: float) -> float:
    return math.inf if n * u >= 0.5 else n * u / (1.0 - n * u)


@functools.lru_cache(maxsize=4096)
def _coefficients(p: Precision, b: int, k: int, w: torch.dtype) -> tuple[float, float, float, float]:
    """``(beta * slack / lower factor of the computed Mag, eta, c_R, c_V)`` of the theorem, for ``b`` rows per
    checksum and ``k`` terms per entry; ``beta`` is inf when the bound is vacuous. ``c_R`` and ``c_V`` are the
    screen's factors (proof step (8))."""
    uw = _UNITS[w]
    th_in, theta = 2 * p.u_in + p.u_in**2, 2 * p.u_ref + p.u_ref**2
    g_acc, gb, gk = _gamma(k, p.u_acc), _gamma(b + 1, uw), _gamma(k + 1, uw)
    alpha = (1 + p.u_out) * (g_acc + th_in * (1 + g_acc)) + p.u_out
    beta = alpha + gb * (2 + alpha) + (gk + theta * (1 + gk)) * (1 + gb)
    lower = (1 - gb) * (1 - gk) * (1 - theta)
    if not math.isfinite(beta) or alpha >= 1 or lower <= 0:
        return math.inf, math.inf, 0.0, 0.0
    eta = torch.finfo(w).tiny * (2 * b * k + 4 * k + 4 * b) + 2 * b * p.tiny_out
    margin = 1 - 2.0**-10
    return (
        beta / lower * _SLACK,
        eta * _SLACK,
        beta * margin**2 / (1 + beta),
        beta * margin**2 / ((1 + gb) * (1 + gk)),
    )


def _block_reduce(
    x: torch.Tensor, rows: int, reduce: Callable[[torch.Tensor, int, bool], torch.Tensor]
) -> torch.Tensor:
    """``reduce(view, dim, keepdim)`` over the rows of each block of ``rows`` consecutive rows of ``x`` (..., m, k) ->
    (..., ceil(m / rows), k). A transposed ``x`` (its rows adjacent in memory, as ``A^T`` of a weight gradient) is
    reduced along its memory order, which on the CPU is several times faster than across it."""
    m = x.shape[-2]
    full = m // rows * rows
    parts = []
    if x.stride(-2) == 1 and x.stride(-1) != 1:
        xt = x.mT
        if full:
            parts.append(reduce(xt[..., :full].reshape(*xt.shape[:-1], full // rows, rows), -1, False).mT)
        if m > full:
            parts.append(reduce(xt[..., full:], -1, True).mT)
    else:
        if full:
            parts.append(reduce(x[..., :full, :].reshape(*x.shape[:-2], full // rows, rows, x.shape[-1]), -2, False))
        if m > full:
            parts.append(reduce(x[..., full:, :], -2, True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


def _block_sums(x: torch.Tensor, rows: int, w: torch.dtype, *, absolute: bool = False) -> torch.Tensor:
    """Sums over blocks of ``rows`` consecutive rows of ``x`` (..., m, k) -> (..., ceil(m / rows), k), in ``w``."""
    # abs() then sum: linalg.vector_norm(ord=1) over a non-last dim is many times slower on the CPU
    return _block_reduce(x, rows, lambda v, dim, keep: (v.abs() if absolute else v).sum(dim=dim, keepdim=keep, dtype=w))


def _gathered_magnitudes(
    v: torch.Tensor, bw: torch.Tensor, where: torch.Tensor, bias_mag: torch.Tensor | None
) -> torch.Tensor:
    """``sum_l |v_gl| |B_lj|`` (+ the block sums of the added term's magnitude, ``bias_mag``) for the block
    columns ``(batch,) g, j`` listed in ``where`` (``nonzero()`` of a block-column mask), ``k`` products each and
    nothing else read: with the signed block sums ``V^`` of ``A`` a lower bound of their magnitudes, with the block
    sums of ``|A|`` the magnitudes themselves (proof step (8)). ``bw`` is ``B`` in ``w``; a column of it is gathered
    along its memory order."""
    g, j = where[:, -2], where[:, -1]
    batch = where[:, 0] if v.dim() == 3 else None
    vs = v[g] if batch is None else v[batch, g]
    if bw.stride(-2) == 1:  # B^T's rows are B's columns (the weight of a dX, transposed)
        bs = bw.mT[j] if batch is None else bw.mT[batch, j]
    else:  # logical (row-major) indices: take reads only the k entries of each column
        k, n = bw.shape[-2], bw.shape[-1]
        flat = torch.arange(k, device=bw.device) * n + j[:, None]
        bs = torch.take(bw, flat if batch is None else flat + batch[:, None] * (k * n))
    lower = (vs.abs() * bs.abs()).sum(dim=-1)
    if bias_mag is not None:
        lower += bias_mag[g, j] if bias_mag.dim() == 2 else bias_mag[where[:, 0], g, j]
    return lower


def _bias_terms(bias: torch.Tensor, shape: torch.Size, rows: int, w: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The block sums of the term added to ``a @ b`` (``addmm``'s and ``baddbmm``'s input, broadcast to the result's
    ``shape``), and of its magnitude. A bias row (a vector, a scalar, or leading dimensions of 1) is the bias times
    each block's number of rows (one rounding, within the ``gamma_w(b)`` of a summation), without materialising the
    rows; any other input (a full matrix, a column) is summed over the blocks like ``C``."""
    m, n = shape[-2], shape[-1]
    if all(d == 1 for d in bias.shape[:-1]) and bias.numel() in (1, n):
        counts = torch.full((m // rows,), float(rows), dtype=w, device=bias.device)
        if m % rows:
            counts = torch.cat([counts, torch.tensor([float(m % rows)], dtype=w, device=bias.device)])
        vw = bias.to(w).reshape(-1).expand(n)
        return counts[:, None] * vw, counts[:, None] * vw.abs()
    full = bias.to(w).expand(shape)
    return _block_sums(full, rows, w), _block_sums(full, rows, w, absolute=True)


_CODES = {torch.float32: 0, torch.bfloat16: 1}
"""Operand dtypes the C engine reads (its code for each); its sums are in fp32, the ``w`` of both."""


def c_engine_available() -> bool:
    """Whether the screen's C engine (``sdcguard/training/checksums/_core.c``) was built at install."""
    return _checksum_core is not None


def _plain(x: torch.Tensor) -> bool:
    """Whether the engine may read ``x`` at its address: a dense host tensor (no subclass, no lazy negation)."""
    return (
        type(x) in (torch.Tensor, torch.nn.Parameter)
        and x.device.type == "cpu"
        and x.layout == torch.strided
        and not x.is_neg()
    )


def _addr(x: torch.Tensor) -> tuple[int, int, int]:
    """``(batch, row, column)`` strides of a 2-D or 3-D tensor, in elements."""
    return (x.stride(0) if x.dim() == 3 else 0, x.stride(-2), x.stride(-1))


def _c_bias(bias: torch.Tensor | None, n: int) -> torch.Tensor | None | Literal[False]:
    """The added term as the engine takes it (a flat row of 1 or ``n`` values; None: no bias), or False when it is
    not a row (a full matrix, a column: the torch path sums it)."""
    if bias is None:
        return None
    if (
        bias.dtype not in _CODES
        or not _plain(bias)
        or not all(d == 1 for d in bias.shape[:-1])
        or bias.numel() not in (1, n)
    ):
        return False
    return bias.reshape(-1).contiguous()


def _c_sums(a: torch.Tensor, c: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The block sums of ``A`` and of ``C`` in fp32 from the C engine, each read once; None where it cannot take
    them (not built, not the CPU, another dtype or layout)."""
    if (
        _checksum_core is None
        or not _plain(a)
        or not _plain(c)
        or c.dtype not in _CODES
        or a.dtype != c.dtype
        or a.dim() != c.dim()
        or a.dim() not in (2, 3)
        or min(a.shape) == 0
        or min(c.shape) == 0
    ):
        return None
    batch = a.shape[0] if a.dim() == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], c.shape[-1]
    groups = (m + rows - 1) // rows
    v = torch.empty((batch, groups, k) if a.dim() == 3 else (groups, k), dtype=torch.float32)
    s = torch.empty((batch, groups, n) if a.dim() == 3 else (groups, n), dtype=torch.float32)
    _checksum_core.block_sums(
        a.data_ptr(),
        c.data_ptr(),
        _CODES[c.dtype],
        batch,
        m,
        k,
        n,
        _addr(a),
        _addr(c),
        rows,
        v.data_ptr(),
        s.data_ptr(),
    )
    return v, s


def _cleared_by_engine(
    s: torch.Tensor,
    r: torch.Tensor,
    v: torch.Tensor,
    va: torch.Tensor | None,
    bw: torch.Tensor,
    bias: torch.Tensor | None,
    rows: int,
    m: int,
    by_reference: float,
    by_sums: float,
) -> bool | None:
    """The screen (8) in one C pass over the block columns: tiers (a) and (b), and (c) when ``va`` (the block sums
    of ``|A|``) is given. True when every column is cleared; None where the engine cannot take the added term (a
    full matrix, a column) or these tensors."""
    assert _checksum_core is not None
    n = r.shape[-1]
    flat = _c_bias(bias, n)
    if flat is False or not r.is_contiguous() or not _plain(bw) or bw.dim() != r.dim():
        return None
    groups, k = v.shape[-2], v.shape[-1]
    code, length, address = (0, 0, 0) if flat is None else (_CODES[flat.dtype], flat.numel(), flat.data_ptr())
    return bool(
        _checksum_core.cleared(
            s.data_ptr(),
            r.data_ptr(),
            v.data_ptr(),
            0 if va is None else va.data_ptr(),
            bw.data_ptr(),
            v.numel() // (groups * k),
            groups,
            k,
            n,
            _addr(bw),
            address,
            code,
            length,
            rows,
            m,
            by_reference,
            by_sums,
        )
    )


def _c_magnitudes(a: torch.Tensor, v: torch.Tensor, rows: int) -> torch.Tensor:
    """The block sums of ``|A|`` in fp32 from the C engine (``a`` as :func:`_c_sums` took it; ``v`` its sums)."""
    assert _checksum_core is not None
    va = torch.empty_like(v)
    batch = a.shape[0] if a.dim() == 3 else 1
    _checksum_core.magnitude_sums(
        a.data_ptr(), _CODES[a.dtype], batch, a.shape[-2], a.shape[-1], _addr(a), rows, va.data_ptr()
    )
    return va


def check_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    precision: Precision,
    rows: int = DEFAULT_ROWS,
    screen: bool | None = None,
) -> torch.Tensor:
    """The number of block columns of ``c = [bias +] a @ b`` (2-D, or batched 3-D) whose checksum differs from the
    operands' by more than the bound (a 0-d int64 tensor on ``c``'s device).

    ``screen`` (default: on the CPU) first compares with the cheap lower bounds of the magnitudes of (8) and
    computes the magnitudes only when some column is cleared by neither; the count is the same either way, for any
    ``c`` (proven in (8)). It reads values on the host, which on a GPU would stall the stream, so there the
    magnitudes are always computed and nothing syncs."""
    w = torch.float64 if c.dtype == torch.float64 else torch.float32
    k = a.shape[-1] + (1 if bias is not None else 0)
    m = c.shape[-2]
    rows = max(1, min(rows, m))
    coef, eta, by_reference, by_sums = _coefficients(precision, rows, k + 1, w)
    if not math.isfinite(coef):
        return torch.zeros((), dtype=torch.int64, device=c.device)
    bw = b.to(w)
    engine = _c_sums(a, c, rows)  # both block sums in one C call where it can (the same sums with or without screen)
    v = _block_sums(a, rows, w) if engine is None else engine[0]
    r = torch.matmul(v, bw)
    screening = c.device.type == "cpu" if screen is None else screen
    va: torch.Tensor | None = None
    if screening and engine is not None:  # usually the first call settles it; the magnitudes only when it did not
        cleared = _cleared_by_engine(engine[1], r, v, None, bw, bias, rows, m, by_reference, by_sums)
        if cleared is False:
            va = _c_magnitudes(a, v, rows)
            cleared = _cleared_by_engine(engine[1], r, v, va, bw, bias, rows, m, by_reference, by_sums)
        if cleared:
            return torch.zeros((), dtype=torch.int64, device=c.device)
        # the engine ran every tier and some column is left: the torch tiers would only repeat that work, so go
        # straight to the full check (the count is the same either way, (8)); None: it could not take the added term
        screening = cleared is None
    bias_mag: torch.Tensor | None = None
    if bias is not None:
        bias_sum, bias_mag = _bias_terms(bias, c.shape, rows, w)
        r = r + bias_sum
    diff = ((_block_sums(c, rows, w) if engine is None else engine[1]) - r).abs()
    if screening:
        # (8): a column with diff <= c_R |R| holds the bound, whatever C is; so does one with diff <= c_V L, or <=
        # c_V times its magnitudes computed on their own, each only for the columns still left
        size = r.abs()
        left = ~((diff <= size * by_reference) & (size < math.inf))
        if not bool(left.any()):
            return torch.zeros((), dtype=torch.int64, device=c.device)
        where, d = left.nonzero(), diff[left]
        for magnitudes in (False, True):  # L, then (for the columns L left) the columns' own magnitudes M
            sums = v
            if magnitudes:
                sums = va = _block_sums(a, rows, w, absolute=True) if va is None else va
            lower = _gathered_magnitudes(sums, bw, where, bias_mag)
            keep = ~((d <= lower.mul_(by_sums)) & (lower < math.inf))
            if not bool(keep.any()):
                return torch.zeros((), dtype=torch.int64, device=c.device)
            where, d = where[keep], d[keep]
    babs = bw.abs()
    if va is None:  # the screen did not compute them
        va = _block_sums(a, rows, w, absolute=True)
    mag = torch.matmul(va, babs)
    if bias_mag is not None:
        mag = mag + bias_mag
    # a column whose magnitudes are not finite (a NaN or Inf operand), or could overflow the output, is not judged
    judged = mag < 0.25 * torch.finfo(c.dtype).max
    # inputs flushed to zero lose at most tiny_in |other operand| per product (_flushed), outputs tiny_out (eta)
    bound = mag.mul_(coef).add_(_flushed(babs, va, rows, precision.tiny_in)).add_(eta)
    return (judged & ~(diff <= bound)).sum()


def _flushed(babs: torch.Tensor, va: torch.Tensor, rows: int, tiny_in: float) -> torch.Tensor:
    """``tiny_in (rows sum_l |B_lj| + sum_l Va_gl)``: what operands flushed to zero (DAZ) can lose per block column
    (times the slack)."""
    return (babs.sum(dim=-2, keepdim=True) * rows + va.sum(dim=-1, keepdim=True)).mul_(tiny_in * _SLACK)
