"""The checksum identity of a matmul and a rigorous bound on its rounding error: does a computed product hold?

For ``C = A @ B`` (``A``: m x k, ``B``: k x n; batched alike) the identity ``e_G^T (A B) = (e_G^T A) B`` holds exactly
for the indicator ``e_G`` of every block ``G`` of ``b`` consecutive rows. :func:`check_matmul` compares the column
sums of each row block of the computed ``C`` with the same sums computed from the operands (two small matmuls,
``2/b`` of the matmul's work, plus one read of ``A`` and ``C``) and counts the block columns whose difference
exceeds the bound below. It reads its inputs only; nothing it computes reaches the training step.

Notation: ``u`` the unit roundoff of the precision named, ``gamma(n) = n u / (1 - n u)``, ``|X|`` elementwise,
``Mag = (e_G^T |A|) |B|`` (plus ``|bias|`` terms), the sum over the block's entries of ``sum_l |A_il| |B_lj|``. The
computation being checked is modelled by the units of :class:`~.precision.Precision` (read from torch's settings by
:mod:`.precision`): ``u_in`` (each operand rounded before the products: TF32 or bf16 internal precision of an fp32
matmul, else 0), ``u_acc`` (the accumulation of the products: fp32, or fp16 with ``allow_fp16_accumulation``),
``u_red`` and ``s`` (a split-K reduction of at most ``s`` partial sums in the output type, where reduced-precision
reductions are allowed; else ``u_red = 0``), ``u_out`` (the rounding of the result to the output dtype: bf16, fp16;
0 for fp32) and whether the accumulations *truncate* (tensor cores, on CUDA). ``S_acc(n)`` is the error factor of a
sum of ``n`` terms: ``gamma_acc(n)`` rounding to nearest, ``gamma_2acc(3n + 3)`` (unit ``2 u_acc``) truncating.

**Theorem.** For every computed ``C^`` that the backend produces by any order of summation of the ``k' = k (+1 with
a bias)`` products, ``|S - R| <= beta * Mag + eta`` for every block column, where ``S`` is the computed block sum of
``C^``, ``R`` the computed reference and ``beta = alpha + gamma_w(b)(2 + alpha) + (S_w(k') + theta)(1 +
gamma_w(b))``, ``alpha = e + g (1 + e) + u_out (1 + g)(1 + e)`` with ``e = S_acc(k') + th_in (1 + S_acc(k'))``, ``g
= gamma_red(min(s, k') + 1)``, ``th_in = 2 u_in + u_in^2``, ``theta`` the same for the check's own fp32 matmuls
(whose accumulation ``S_w`` truncates where the matmul's does) and ``eta`` the absolute underflow terms.

*Proof.* (1) Each product ``a b`` of rounded operands is ``a b (1 + t)``, ``|t| <= th_in``. (1a) A sum of ``k'``
terms in any order, rounding to nearest with ``u_acc``, has error at most ``gamma_acc(k')`` times the sum of the
terms' magnitudes (Higham, *Accuracy and Stability*, 3.1; an FMA only removes roundings). (1b) A tensor core adds a
block of ``n_b`` products to the running sum by aligning every significand to the largest exponent among them and
truncating to ``p`` bits, then truncating the sum (Fasi, Higham, Mikaitis, Pranesh 2021): each aligned term loses
less than ``2 u`` of the largest magnitude of the block, the sum less than ``2 u`` of itself, so one block adds at
most ``2 u (n_b + 2)`` times the magnitudes summed so far (to first order), and ``ceil(k' / n_b)`` blocks at most
``2 u (n_b + 2) ceil(k' / n_b) <= 2 u (3 k' + 3)`` times the magnitudes, for every block size ``1 <= n_b <= k'``;
the higher-order terms are those of ``3 k' + 3`` factors ``(1 + d)``, ``|d| <= 2 u``: ``gamma_2u(3 k' + 3)``. So
``S_acc(k')`` bounds either accumulation relative to ``sum |terms|``, whatever the order, the blocking or
the split of the sum into partial sums accumulated apart. (1c) Where reduced-precision reductions are allowed, the
``<= min(s, k')`` partial sums (plus the added term, as one more part) are each rounded to the output type and added
in it, in any order: at most ``min(s, k') + 1`` roundings in ``u_red`` of numbers whose magnitudes sum to at most
``(1 + e) sum |terms|``. (1d) Rounding to the output adds ``u_out`` of the result (allowed for whether or not (1c)
ended in the output type already). So ``|C^_ij - (AB)_ij| <= alpha sum_l |A_il||B_lj|`` and ``|C^_ij| <= (1 + alpha)
sum_l |A_il||B_lj|``. (2) The block sum ``S`` of ``b`` terms in the check's precision ``w`` errs by at most
``gamma_w(b) sum |C^| <= gamma_w(b)(1 + alpha) Mag``, and ``sum_G C^ = e_G^T A B + E`` with ``|E| <= alpha Mag``.
(3) The computed ``V^ = e_G^T A + dV``, ``|dV| <= gamma_w(b) e_G^T|A|``, so ``|dV B| <= gamma_w(b) Mag`` and ``|V^| <=
(1 + gamma_w(b)) e_G^T|A|``; ``R = fl(V^ B)`` errs from ``V^ B`` by at most ``(S_w(k') + theta(1 + S_w(k')))
|V^||B|`` ((1) for the check's own matmul). (4) ``e_G^T A B = (e_G^T A) B`` exactly, so the triangle inequality over
(2)-(3) gives ``beta Mag``. (5) ``Mag`` itself is computed from non-negative terms, so the computed value is at
least ``(1 - gamma_w(b))(1 - S_w(k'))(1 - theta)`` times the true one: dividing by that factor bounds the true
``Mag`` from above. (6) Underflow adds at most the smallest normal number of each precision per rounding
(flush-to-zero included) and, where inputs are flushed, ``tiny_in |other operand|`` per product: ``eta``. (7)
Evaluating ``|S - R|`` and the bound takes a handful of roundings in ``w``; the factor ``1 + 2**-10`` covers them. A
block column whose ``Mag`` is not finite or could reach the output's overflow threshold is not judged (a legitimate
overflow is possible there); in every other column an infinite or NaN ``C^`` entry is impossible, so any NaN/Inf
difference is a fault. QED.

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
block column, whatever its bits. *The claim* (:data:`CLAIMS`): a check is counted *checked* only when that catches
the smallest change claimed for its dtype on an entry of its block column's mean magnitude ``Mag / b``: halving it
(the lowest exponent bit: fp32, fp64) or negating it (bf16, fp16), i.e. ``2 beta' < f / b`` for the computed factor
``beta'`` and ``f`` = 1/2 or 2; a check whose bound is wider is *unverifiable* (:func:`unverifiable` says why,
naming the setting), and one whose bound is infinite is refused (:class:`VacuousBound`). NaN and Inf in a judged
column always exceed the bound; flips of the low mantissa bits never do (they are below the rounding noise, and left
to replay). The bound grows with ``b`` (``rows``): fewer rows per checksum catch smaller errors for more work.

What the identity cannot see, whatever the bound: it compares sums over a block of rows, so a fault that keeps every
block column's sum (two rows of one block swapped, a block's rows reversed, two errors of one block column that
cancel) is invisible to it, and a column not judged (its magnitudes infinite, NaN, or within a factor of 4 of the
output's overflow threshold, as where an added causal mask holds ``finfo.min``) is not checked at all, so a NaN
there passes. Replay sees all of these (it compares every bit of the results of a sampled step).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal

import torch

from .precision import UNITS, Precision

try:  # built at install where a C compiler was present; without it the same screen runs as torch ops
    from . import _core as _checksum_core
except ImportError:  # pragma: no cover - depends on the install
    _checksum_core = None  # type: ignore[assignment]  # (the stub types the built module)

__all__ = ["check_matmul", "unverifiable", "VacuousBound", "CLAIMS", "DEFAULT_ROWS", "c_engine_available"]

DEFAULT_ROWS = 32
"""Rows of the result summed per checksum (``b``): the check costs ``2/b`` of the matmul's multiply-adds."""

CLAIMS: dict[torch.dtype, tuple[str, float]] = {
    torch.float64: ("an exponent flip (an entry halved)", 0.5),
    torch.float32: ("an exponent flip (an entry halved)", 0.5),
    torch.bfloat16: ("a sign flip", 2.0),
    torch.float16: ("a sign flip", 2.0),
}
"""dtype -> the smallest change the checks claim to catch in a result of that dtype, and its size as a multiple of
an entry of its block column's mean magnitude (``Mag / b``): see "The claim" above."""

_SLACK = 1.0 + 2.0**-10


class VacuousBound(ValueError):
    """The settings make the rounding bound of this matmul infinite: no result could fail it, so it is not
    checked (:func:`unverifiable` says which setting)."""


def _gamma(n: int, u: float) -> float:
    return math.inf if n * u >= 0.5 else n * u / (1.0 - n * u)


def _sum_error(n: int, u: float, truncating: bool) -> float:
    """``S(n)`` of the theorem: the error factor of a sum of ``n`` terms, rounding to nearest or truncating."""
    return _gamma(3 * n + 3, 2 * u) if truncating else _gamma(n, u)


@functools.lru_cache(maxsize=4096)
def _coefficients(p: Precision, b: int, k: int, w: torch.dtype) -> tuple[float, float, float, float]:
    """``(beta * slack / lower factor of the computed Mag, eta, c_R, c_V)`` of the theorem, for ``b`` rows per
    checksum and ``k`` terms per entry; ``beta`` is inf when the bound is vacuous. ``c_R`` and ``c_V`` are the
    screen's factors (proof step (8))."""
    uw = UNITS[w]
    th_in, theta = 2 * p.u_in + p.u_in**2, 2 * p.u_ref + p.u_ref**2
    g_acc, gb, gk = _sum_error(k, p.u_acc, p.truncating), _gamma(b + 1, uw), _sum_error(k + 1, uw, p.truncating)
    g_red = _gamma(min(p.splits, k) + 1, p.u_red) if p.u_red else 0.0
    e = g_acc + th_in * (1 + g_acc)
    alpha = e + g_red * (1 + e) + p.u_out * (1 + g_red) * (1 + e)  # (1 + u_out)(1 + g)(1 + e) - 1, expanded
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


def _work(dtype: torch.dtype) -> torch.dtype:
    """The precision ``w`` the check computes in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@functools.lru_cache(maxsize=4096)
def unverifiable(precision: Precision, dtype: torch.dtype, *, m: int, k: int, rows: int = DEFAULT_ROWS) -> str | None:
    """Why a check of a result of ``dtype`` with ``m`` rows and ``k`` terms per entry (the added term included)
    cannot make the claim for its dtype (:data:`CLAIMS`) at ``rows`` rows per checksum, naming the setting that
    widens the bound; None when it can (it is *checked*), or when there is nothing to check (``m == 0``)."""
    if m == 0:
        return None
    b = max(1, min(rows, m))
    coef = _coefficients(precision, b, k + 1, _work(dtype))[0]
    claim, size = CLAIMS.get(dtype, ("any change", 0.0))
    if 2 * coef < size / b:
        return None
    why = precision.setting or f"{str(dtype).removeprefix('torch.')} rounding over {k} terms"
    if not math.isfinite(coef):
        return f"the rounding bound is infinite ({why})"
    return f"the rounding bound, {coef:.2g} of a block column's magnitudes at {b} rows, cannot see {claim} ({why})"


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
        if m % rows:  # torch.full, not torch.tensor: no host-to-device copy (a GPU check never waits on the host)
            counts = torch.cat([counts, torch.full((1,), float(m % rows), dtype=w, device=bias.device)])
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
    magnitudes are always computed and nothing syncs.

    A result with no entries (``m``, ``n`` or the batch 0) has no block column: 0. ``k = 0`` is checked like any
    other (the product is zeros, plus the added term). Raises :class:`VacuousBound` where the bound is infinite (no
    result could fail it: :func:`unverifiable` names the setting); a finite bound too wide for the claim still
    counts what it can (NaN, Inf, large errors), and :func:`unverifiable` says so."""
    w = _work(c.dtype)
    k = a.shape[-1] + (1 if bias is not None else 0)
    m = c.shape[-2]
    if c.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=c.device)
    rows = max(1, min(rows, m))
    coef, eta, by_reference, by_sums = _coefficients(precision, rows, k + 1, w)
    if not math.isfinite(coef):
        raise VacuousBound(f"cannot check this matmul: {unverifiable(precision, c.dtype, m=m, k=k, rows=rows)}")
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
