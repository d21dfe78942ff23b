"""The fault model: the one definition of what a simulated hardware fault does to raw bits.

A :class:`Fault` describes a faulty unit (what it does to a value, when it fires, which values it touches);
a :class:`FaultModel` is one such unit in operation: it counts the computations it sees and decides, from the
seed and that counter alone, whether this computation is hit, which elements, and what their bits become.
Every change is returned as a :class:`FaultRecord` (flat index, bits before and after).

Everything that corrupts data in sdcguard goes through :meth:`FaultModel.plan`: numpy arrays
(:meth:`FaultModel.corrupt_array`, the scanner's ``--inject`` fire drill) and torch tensors
(``sdcguard.inject.torch_faults``, which only reads the chosen elements and writes back the planned bits).

Default proportions of ``pattern="mix"`` follow NVIDIA's field study ("The Anatomy of Silent Data Corruption",
arXiv 2605.04213): about 51% of corrupted values are zeroed, 48% are wrong but valid numbers with one or several
flipped bits (low mantissa bits hit more often than exponent bits), 1% become NaN or Inf; corrupted positions
repeat with warp-aligned periods (32 lanes); a few events are control faults that corrupt a large part of one
output tile. The split of flip counts and bit-class weights below is this model's choice, within those bounds.

Numpy only: this module must import without torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import numpy as np

from ..errors import BadInput
from . import formats as _formats
from .formats import BIT_CLASSES, BitClass, BitFormat

__all__ = [
    "Pattern",
    "Timing",
    "Effect",
    "BitClass",
    "BIT_CLASSES",
    "PATTERNS",
    "TIMINGS",
    "MIX_PROPORTIONS",
    "MIX_FLIP_COUNTS",
    "MIX_CLASS_WEIGHTS",
    "MIX_CONTROL",
    "WARP",
    "Fault",
    "FaultModel",
    "FaultRecord",
]

Pattern = Literal["bitflip", "multibit", "zero", "stuck0", "stuck1", "nan", "inf", "mix"]
Timing = Literal["transient", "intermittent", "sticky"]
Effect = Literal["bitflip", "multibit", "zero", "stuck0", "stuck1", "nan", "inf"]
"""What was done to one element (a ``mix`` fault records the effect it drew)."""

PATTERNS: tuple[str, ...] = get_args(Pattern)
TIMINGS: tuple[str, ...] = get_args(Timing)

MIX_PROPORTIONS: dict[str, float] = {"zero": 0.51, "valid": 0.48, "nonfinite": 0.01}
"""Share of corrupted values zeroed / wrong but valid (flipped bits) / NaN or Inf (integers: valid instead)."""
MIX_FLIP_COUNTS: dict[int, float] = {1: 0.70, 2: 0.20, 3: 0.10}
"""How many bits a wrong-but-valid value has flipped."""
MIX_CLASS_WEIGHTS: dict[BitClass, float] = {"low_mantissa": 0.55, "high_mantissa": 0.30, "exponent": 0.10, "sign": 0.05}
"""Relative chance that a flipped bit falls in each class (uniform within a class)."""
MIX_CONTROL = 0.02
"""Chance that a ``mix`` event is a control fault (a large part of one tile corrupted)."""
WARP = 32
"""Lanes per warp: the default period of repeated corrupted positions in ``mix``."""

_MAX_VALID_TRIES = 16


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A faulty unit: what it does to a value, when, and to which values. Reproducible from ``seed``."""

    pattern: Pattern = "mix"
    """``bitflip`` (one bit), ``multibit`` (``nbits`` distinct bits), ``zero`` (all bits 0), ``stuck0`` /
    ``stuck1`` (one bit forced; a no-op where it already holds that value), ``nan`` / ``inf`` (sign kept),
    ``mix`` (the published proportions, see the module docstring)."""
    bit: int | BitClass | None = None
    """Which bit(s): a position (0 = least significant), a bit class (one bit drawn from it per value), or
    None (any bit). Used by bitflip, stuck0, stuck1 (position or class) and multibit (class only)."""
    nbits: int = 2
    """Bits flipped per value by ``multibit`` (distinct)."""
    timing: Timing = "sticky"
    """``transient``: fires once (at the first computation that passes ``rate`` and the value range), then never;
    ``intermittent``: each computation is hit with probability ``rate``; ``sticky``: every computation is hit."""
    rate: float = 1.0
    """Probability per computation that it is hit (intermittent; transient: until it fired once). Sticky: 1."""
    elements: int = 1
    """Values corrupted per hit (fewer when the array, or the value range, has fewer)."""
    period: int | None = None
    """Corrupted positions repeat every ``period`` elements (a faulty lane); 0: drawn at random.
    None: the pattern's default (``mix``: 32, warp-aligned; otherwise random)."""
    control: float | None = None
    """Chance that a hit is a control fault: 50-100% of one ``tile`` corrupted instead of ``elements`` values.
    None: the pattern's default (``mix``: 0.02; otherwise 0)."""
    tile: int = 1024
    """Elements per output tile for control faults: a square block of the last two dimensions, ``isqrt(tile)``
    on a side (1024: 32x32, one thread block's output), or an aligned flat run for 1-d outputs."""
    value_range: tuple[float, float] | None = None
    """Only values ``v`` with ``lo <= v < hi`` (compared in float64; NaN never) can be corrupted; a computation
    without such values is not hit (and does not use up a transient fault)."""
    seed: int = 0
    """Seed of every random choice; the same seed and the same sequence of computations give the same faults."""

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise BadInput(f"unknown fault pattern {self.pattern!r}: use one of {', '.join(PATTERNS)}")
        if self.timing not in TIMINGS:
            raise BadInput(f"unknown fault timing {self.timing!r}: use one of {', '.join(TIMINGS)}")
        if isinstance(self.bit, bool) or not (self.bit is None or isinstance(self.bit, (int, str))):
            raise BadInput(f"bit must be a position, a bit class or None, got {self.bit!r}")
        if isinstance(self.bit, int) and not 0 <= self.bit < 64:
            raise BadInput(f"bit position must be in 0..63, got {self.bit}")
        if isinstance(self.bit, str) and self.bit not in BIT_CLASSES:
            raise BadInput(f"unknown bit class {self.bit!r}: use one of {', '.join(BIT_CLASSES)} or a position")
        if self.pattern == "multibit" and isinstance(self.bit, int):
            raise BadInput("multibit takes a bit class (or none), not one position: use bitflip for one bit")
        if self.bit is not None and self.pattern in ("zero", "nan", "inf", "mix"):
            raise BadInput(f"pattern {self.pattern} does not take a bit")
        if not isinstance(self.nbits, int) or not 2 <= self.nbits <= 64:
            raise BadInput(f"nbits must be 2..64, got {self.nbits!r}")
        if not (isinstance(self.rate, (int, float)) and 0.0 <= self.rate <= 1.0):
            raise BadInput(f"rate must be a probability in [0, 1], got {self.rate!r}")
        if self.timing == "sticky" and self.rate != 1.0:
            raise BadInput("a sticky fault hits every computation: drop rate, or use timing intermittent")
        if not isinstance(self.elements, int) or self.elements < 1:
            raise BadInput(f"elements must be >= 1, got {self.elements!r}")
        if self.period is not None and (not isinstance(self.period, int) or self.period < 0):
            raise BadInput(f"period must be >= 0, got {self.period!r}")
        if self.control is not None and not 0.0 <= self.control <= 1.0:
            raise BadInput(f"control must be a probability in [0, 1], got {self.control!r}")
        if not isinstance(self.tile, int) or self.tile < 1:
            raise BadInput(f"tile must be >= 1, got {self.tile!r}")
        if self.value_range is not None:
            lo, hi = self.value_range
            if math.isnan(lo) or math.isnan(hi) or not lo < hi:
                raise BadInput(f"value range needs lo < hi, got [{lo}, {hi})")
            object.__setattr__(self, "value_range", (float(lo), float(hi)))
        if not isinstance(self.seed, int) or self.seed < 0:
            raise BadInput(f"seed must be an integer >= 0, got {self.seed!r}")

    @property
    def effective_period(self) -> int:
        """The period in use (0: random positions)."""
        if self.period is not None:
            return self.period
        return WARP if self.pattern == "mix" else 0

    @property
    def effective_control(self) -> float:
        """The control-fault chance in use."""
        if self.control is not None:
            return self.control
        return MIX_CONTROL if self.pattern == "mix" else 0.0

    def in_range(self, values: np.ndarray) -> np.ndarray:
        """Which values (float64) a value-range trigger lets through: ``lo <= v < hi``; all without a range."""
        if self.value_range is None:
            return np.ones(np.shape(values), dtype=bool)
        lo, hi = self.value_range
        v = np.asarray(values, dtype=np.float64)
        return (v >= lo) & (v < hi)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class FaultRecord:
    """Exactly what one fault did to one element."""

    index: int
    """Flat index of the element in C (row-major) order of the array's shape."""
    before: int
    """Raw bits before (as an unsigned integer)."""
    after: int
    """Raw bits after."""
    effect: Effect
    """What was done to it."""
    dtype: str
    """Format name (``float32``, ``bfloat16`` ...)."""
    call: int
    """Index of the computation (the model's counter) that was hit."""
    control: bool = False
    """Part of a control fault (a tile corrupted)."""

    @property
    def xor(self) -> int:
        """The bits that changed."""
        return self.before ^ self.after

    @property
    def changed(self) -> bool:
        """False where the fault was masked (zeroing a zero, a stuck bit already at its value)."""
        return self.before != self.after

    @property
    def flipped_bits(self) -> tuple[int, ...]:
        """Positions of the changed bits."""
        x = self.xor
        return tuple(i for i in range(x.bit_length()) if x >> i & 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "xor": self.xor}


ReadBits = Callable[[np.ndarray], np.ndarray]


class FaultModel:
    """One faulty unit in operation: counts computations and decides, from ``fault.seed`` and that count, what
    each one suffers. Not thread-safe; one model per simulated device or target."""

    def __init__(self, fault: Fault) -> None:
        if not isinstance(fault, Fault):
            raise BadInput(f"FaultModel needs a Fault, got {type(fault).__name__}")
        self.fault = fault
        self.calls = 0
        """Computations seen so far (the counter every decision is keyed on)."""
        self.hits = 0
        """Computations that were hit."""

    def __repr__(self) -> str:
        return f"FaultModel({self.fault!r}, calls={self.calls}, hits={self.hits})"

    def reset(self) -> None:
        """Back to the state of a fresh model: the same faults will repeat."""
        self.calls = 0
        self.hits = 0

    @property
    def spent(self) -> bool:
        """A transient fault that already fired."""
        return self.fault.timing == "transient" and self.hits > 0

    def plan(
        self,
        n: int,
        fmt: BitFormat | str,
        *,
        read_bits: ReadBits,
        eligible: np.ndarray | Callable[[], np.ndarray] | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> list[FaultRecord]:
        """Decide what happens to one computation whose output has ``n`` elements of format ``fmt``.

        ``read_bits(indices)`` returns the raw bits (unsigned integers) of the output at sorted flat
        ``indices``; ``eligible`` holds the sorted flat indices a value range lets through (None: all), or is a
        function returning them, called only when the computation passes the rate draw (it may be costly).
        ``shape`` (C order, product ``n``) lets a control fault hit a 2-d tile; without it tiles are flat runs.
        Returns the records (empty: not hit); the caller writes each ``after`` at its ``index``.
        Always advances the computation counter.
        """
        f = self.fault
        fmt = _formats.get(fmt) if isinstance(fmt, str) else fmt
        call = self.calls
        self.calls += 1
        if self.spent or n <= 0:
            return []
        if f.rate < 1.0 and np.random.default_rng([f.seed, call, 1]).random() >= f.rate:
            return []
        if callable(eligible):
            eligible = eligible()
        if eligible is not None:
            eligible = np.asarray(eligible, dtype=np.int64)
            if eligible.size == 0:
                return []
        # A transient fault is a one-off event: its own draws. Sticky and intermittent faults are a broken unit:
        # the same draws every time, so a retest of the same computation reproduces the same wrong bits.
        key = [f.seed, call, 2] if f.timing == "transient" else [f.seed, 0, 2]
        rng = np.random.default_rng(key)
        control = f.effective_control > 0 and rng.random() < f.effective_control
        if shape is not None and math.prod(shape) != n:
            raise BadInput(f"shape {shape} does not hold {n} elements")
        index = self._positions_tile(rng, n, eligible, shape) if control else self._positions(rng, n, eligible)
        if index.size == 0:
            return []
        # masked to the format's width: a signed view read by the caller must not sign-extend
        before = np.asarray(read_bits(index)).astype(np.uint64) & np.uint64((1 << fmt.width) - 1)
        records = []
        for i, b in zip(index.tolist(), before.tolist(), strict=True):
            effect, after = self._corrupt_one(rng, fmt, int(b))
            records.append(
                FaultRecord(
                    index=i, before=int(b), after=after, effect=effect, dtype=fmt.name, call=call, control=control
                )
            )
        self.hits += 1
        return records

    def corrupt_array(self, a: np.ndarray, *, dtype: str | None = None) -> tuple[np.ndarray, list[FaultRecord]]:
        """A corrupted C-contiguous copy of ``a`` (same shape and dtype) and the records of what changed.

        ``dtype`` names the format when the array holds raw bits of one numpy lacks (a ``uint16`` array of
        ``bfloat16`` bits, a ``uint8`` array of ``float8_e4m3fn``). ``a`` itself is never modified.
        """
        a = np.asarray(a)
        fmt = _formats.get(dtype) if dtype is not None else _formats.format_of(a.dtype)
        if a.dtype.itemsize * 8 != fmt.width:
            raise BadInput(f"a {a.dtype} array cannot hold {fmt.name} values ({fmt.width} bits each)")
        out = np.array(a, copy=True, order="C")
        flat = out.reshape(-1).view(fmt.uint)
        eligible = None
        if self.fault.value_range is not None:
            eligible = np.flatnonzero(self.fault.in_range(fmt.decode(flat)))
        records = self.plan(flat.size, fmt, read_bits=lambda idx: flat[idx], eligible=eligible, shape=out.shape)
        if records:
            idx = np.fromiter((r.index for r in records), dtype=np.int64, count=len(records))
            flat[idx] = np.fromiter((r.after for r in records), dtype=np.uint64, count=len(records)).astype(fmt.uint)
        return out, records

    # -- where -----------------------------------------------------------------------------------------------------
    def _positions(self, rng: np.random.Generator, n: int, eligible: np.ndarray | None) -> np.ndarray:
        f = self.fault
        size = n if eligible is None else eligible.size
        k = min(f.elements, size)
        period = f.effective_period
        if period <= 0 or k == 1:
            pick = rng.choice(size, size=k, replace=False) if k > 1 else rng.integers(size, size=1)
            pos = pick if eligible is None else eligible[pick]
            return np.unique(pos.astype(np.int64))
        # A faulty lane: the positions congruent to a base modulo the period, starting at the base.
        base = int(rng.integers(n)) if eligible is None else int(eligible[rng.integers(size)])
        lane_r = base % period
        if eligible is None:
            m = (n - lane_r + period - 1) // period
            j = (base // period + np.arange(min(f.elements, m))) % m
            pos = lane_r + period * j
        else:
            lane = eligible[eligible % period == lane_r]
            start = int(np.searchsorted(lane, base))
            pos = lane[(start + np.arange(min(f.elements, lane.size))) % lane.size]
        return np.unique(pos.astype(np.int64))

    def _positions_tile(
        self, rng: np.random.Generator, n: int, eligible: np.ndarray | None, shape: tuple[int, ...] | None
    ) -> np.ndarray:
        f = self.fault
        # With a value range, the block is one that holds an eligible element (picked at random): a block drawn
        # among all of them could miss every eligible element and leave the fault without a hit.
        anchor = int(eligible[rng.integers(eligible.size)]) if eligible is not None and eligible.size else None
        if shape is not None and len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1:
            # one square block of the last two dimensions, in one matrix of the batch
            rows, cols = shape[-2], shape[-1]
            side = max(1, math.isqrt(f.tile))
            tr, tc = -(-rows // side), -(-cols // side)
            if anchor is None:
                b, t = divmod(int(rng.integers(n // (rows * cols) * tr * tc)), tr * tc)
                i, j = divmod(t, tc)
            else:
                b, at = divmod(anchor, rows * cols)
                i, j = (at // cols) // side, (at % cols) // side
            r = np.arange(i * side, min(rows, (i + 1) * side), dtype=np.int64)
            c = np.arange(j * side, min(cols, (j + 1) * side), dtype=np.int64)
            cands = (b * rows * cols + r[:, None] * cols + c[None, :]).reshape(-1)
        else:
            t = int(rng.integers(-(-n // f.tile))) if anchor is None else anchor // f.tile
            cands = np.arange(t * f.tile, min(n, (t + 1) * f.tile), dtype=np.int64)
        if eligible is not None:
            cands = np.intersect1d(cands, eligible, assume_unique=True)
        if cands.size == 0:
            return cands
        k = max(1, round(rng.uniform(0.5, 1.0) * cands.size))
        return np.sort(rng.choice(cands, size=k, replace=False))

    # -- what ------------------------------------------------------------------------------------------------------
    def _corrupt_one(self, rng: np.random.Generator, fmt: BitFormat, before: int) -> tuple[Effect, int]:
        f = self.fault
        p = f.pattern
        if p == "zero":
            return "zero", 0
        if p == "nan":
            return "nan", fmt.nan_bits(before & fmt.sign_mask)
        if p == "inf":
            return "inf", fmt.inf_bits(before & fmt.sign_mask)
        if p == "bitflip":
            return "bitflip", before ^ (1 << self._one_bit(rng, fmt))
        if p == "stuck0":
            return "stuck0", before & ~(1 << self._one_bit(rng, fmt))
        if p == "stuck1":
            return "stuck1", before | (1 << self._one_bit(rng, fmt))
        if p == "multibit":
            assert not isinstance(f.bit, int)  # Fault.__post_init__: multibit takes a bit class, not a position
            pool = fmt.all_bits if f.bit is None else fmt.bits(f.bit)
            if len(pool) < f.nbits:
                raise BadInput(f"multibit nbits={f.nbits}, but {fmt.name} {f.bit or 'has'} {len(pool)} bits")
            bits = rng.choice(np.asarray(pool), size=f.nbits, replace=False)
            return "multibit", before ^ _mask(bits)
        return self._mix_one(rng, fmt, before)

    def _one_bit(self, rng: np.random.Generator, fmt: BitFormat) -> int:
        bit = self.fault.bit
        if isinstance(bit, int):
            if bit >= fmt.width:
                raise BadInput(f"bit {bit} is outside {fmt.name} (bits 0..{fmt.width - 1})")
            return bit
        pool = fmt.all_bits if bit is None else fmt.bits(bit)
        if not pool:
            raise BadInput(f"{fmt.name} has no {bit} bits")
        return int(pool[rng.integers(len(pool))])

    def _mix_one(self, rng: np.random.Generator, fmt: BitFormat, before: int) -> tuple[Effect, int]:
        u = rng.random()
        if u < MIX_PROPORTIONS["zero"]:
            return "zero", 0
        if u >= 1.0 - MIX_PROPORTIONS["nonfinite"] and fmt.is_float:
            sign = before & fmt.sign_mask
            if fmt.has_inf and rng.random() < 0.5:
                return "inf", fmt.inf_bits(sign)
            return "nan", fmt.nan_bits(sign)
        pool, cum = _mix_bit_table(fmt)
        nflip = min(_FLIP_COUNTS[int(np.searchsorted(_FLIP_CUM, rng.random(), side="right"))], len(pool))
        for _ in range(_MAX_VALID_TRIES):
            bits: list[int] = []
            while len(bits) < nflip:  # distinct bits, each drawn with its class weight
                b = pool[int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))]
                if b not in bits:
                    bits.append(b)
            after = before ^ _mask(bits)
            if fmt.is_finite_bits(after):
                return ("bitflip" if nflip == 1 else "multibit"), after
        # Rare (a value next to the NaN/Inf encodings): the lowest bit whose flip keeps the value finite.
        for b in range(fmt.width):
            if fmt.is_finite_bits(before ^ (1 << b)):
                return "bitflip", before ^ (1 << b)
        return "zero", 0  # unreachable in these formats: every value has a finite neighbour


_FLIP_COUNTS = tuple(MIX_FLIP_COUNTS)
_FLIP_CUM = np.cumsum(list(MIX_FLIP_COUNTS.values())) / sum(MIX_FLIP_COUNTS.values())


@functools.cache
def _mix_bit_table(fmt: BitFormat) -> tuple[tuple[int, ...], np.ndarray]:
    """Bits a wrong-but-valid value can have flipped, and their cumulative weights (class weight split evenly)."""
    pool = tuple(b for c in MIX_CLASS_WEIGHTS for b in fmt.bits(c))
    weights = [MIX_CLASS_WEIGHTS[c] / len(fmt.bits(c)) for c in MIX_CLASS_WEIGHTS for _ in fmt.bits(c)]
    return pool, np.cumsum(weights)


def _mask(bits: np.ndarray | list[int]) -> int:
    m = 0
    for b in np.asarray(bits).tolist():
        m |= 1 << int(b)
    return m
