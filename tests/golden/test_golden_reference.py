"""Invariants of the exact reference arithmetic and the seeded generators (property tests)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.golden.bits import e4m3_encode, e4m3_table, round_exact
from sdcguard.golden.cases import PORTABLE_CASES
from sdcguard.golden.inputs import inputs_digest, make_inputs
from sdcguard.golden.reference import _div, _fma, _sqrt


def _nearest_even(value: Fraction, p: int) -> Fraction:
    """Round a positive rational to p significant bits, ties to even, by brute force."""
    e = 0
    while value >= 2**p * Fraction(2) ** e:
        e += 1
    while value < 2 ** (p - 1) * Fraction(2) ** e:
        e -= 1
    scaled = value / Fraction(2) ** e
    q = scaled.numerator // scaled.denominator
    rest = scaled - q
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and q % 2):
        q += 1
    return q * Fraction(2) ** e


@given(num=st.integers(1, 2**80), den=st.integers(1, 2**60), e2=st.integers(-100, 100), p=st.integers(2, 53))
def test_round_exact_is_round_to_nearest_even(num: int, den: int, e2: int, p: int) -> None:
    q, e = round_exact(num, den, e2, p)
    assert q < 2**p or q == 2**p
    assert q * Fraction(2) ** e == _nearest_even(Fraction(num, den) * Fraction(2) ** e2, p)


normal32 = st.floats(min_value=2.0**-60, max_value=2.0**60, width=32, allow_subnormal=False)
signed32 = st.builds(lambda x, s: -x if s else x, normal32, st.booleans())


@given(a=signed32, b=signed32)
def test_fp32_division_reference_matches_ieee(a: float, b: float) -> None:
    assert _div(a, b, 24) == float(np.float32(a) / np.float32(b))


@given(a=normal32)
def test_fp32_sqrt_reference_matches_ieee(a: float) -> None:
    assert _sqrt(a, 24) == float(np.sqrt(np.float32(a)))


@given(a=st.floats(min_value=2.0**-200, max_value=2.0**200, allow_subnormal=False))
def test_fp64_sqrt_reference_is_correctly_rounded(a: float) -> None:
    r = _sqrt(a, 53)
    # correctly rounded: r*r brackets a within half an ulp of r on each side
    ulp = np.spacing(r)
    lo, hi = Fraction(r) - Fraction(ulp) / 2, Fraction(r) + Fraction(ulp) / 2
    assert lo * lo <= Fraction(a) <= hi * hi
    assert r == float(np.sqrt(a))


@given(a=signed32, b=signed32, c=signed32)
def test_fp32_fma_reference_is_one_rounding(a: float, b: float, c: float) -> None:
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    got = _fma(a, b, c, 24)
    if exact == 0:
        assert got == 0.0
        return
    want = _nearest_even(abs(exact), 24)
    assert Fraction(got) == (want if exact > 0 else -want)


def test_e4m3_codes_round_trip() -> None:
    table = e4m3_table()
    codes = [b for b in range(256) if not np.isnan(table[b]) and b != 0x80]
    assert np.array_equal(e4m3_encode(table[codes].astype(np.float64)), np.array(codes, dtype=np.uint8))
    assert table[0x7E] == 448.0 and table[0x01] == 2.0**-9


@given(case=st.sampled_from([c for c in PORTABLE_CASES if c.family in ("alu", "ieee", "shared", "memory")]))
def test_inputs_are_a_pure_function_of_the_seed(case) -> None:
    assert inputs_digest(make_inputs(case)) == inputs_digest(make_inputs(case))
