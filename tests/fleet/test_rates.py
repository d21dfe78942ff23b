"""Rates and one-sided Clopper–Pearson bounds: properties, the zero-failure rule, SQL aggregation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy.stats import beta, binom

from sdcguard.fleet.rates import clopper_pearson, clopper_pearson_arrays, device_rates, fleet_rates
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, result, scan

confidences = st.sampled_from([0.8, 0.9, 0.95, 0.99])


@st.composite
def counts(draw: st.DrawFn) -> tuple[int, int]:
    n = draw(st.integers(1, 100_000))
    return draw(st.integers(0, n)), n


@given(counts(), confidences)
def test_bounds_bracket_the_rate(kn: tuple[int, int], c: float) -> None:
    k, n = kn
    low, high = clopper_pearson(k, n, c)
    assert 0.0 <= low <= k / n <= high <= 1.0
    assert (low == 0.0) == (k == 0)
    assert (high == 1.0) == (k == n)


@given(counts(), confidences, st.integers(2, 50))
def test_bounds_tighten_with_more_executions(kn: tuple[int, int], c: float, factor: int) -> None:
    k, n = kn
    assume(0 < k < n)
    low, high = clopper_pearson(k, n, c)
    low2, high2 = clopper_pearson(k * factor, n * factor, c)  # same observed rate, more evidence
    assert high2 - low2 < high - low
    assert low2 >= low - 1e-12 and high2 <= high + 1e-12


@given(st.integers(1, 1_000_000), confidences)
def test_zero_failures_upper_bound_is_the_rule_of_n(n: int, c: float) -> None:
    _, high = clopper_pearson(0, n, c)
    assert math.isclose(high, 1 - (1 - c) ** (1 / n), rel_tol=1e-9, abs_tol=1e-15)


def test_299_clean_executions_bound_the_rate_by_one_percent() -> None:
    assert clopper_pearson(0, 299, 0.95)[1] <= 0.01
    assert clopper_pearson(0, 298, 0.95)[1] > 0.01  # and 299 is the smallest such n = ln(0.05)/ln(0.99)
    assert math.ceil(math.log(0.05) / math.log(0.99)) == 299


@given(counts(), confidences)
def test_bounds_are_beta_quantiles(kn: tuple[int, int], c: float) -> None:
    k, n = kn
    low, high = clopper_pearson(k, n, c)
    if k > 0:
        assert math.isclose(low, beta.ppf(1 - c, k, n - k + 1), rel_tol=1e-7, abs_tol=1e-15)
    if k < n:
        assert math.isclose(high, beta.ppf(c, k + 1, n - k), rel_tol=1e-7, abs_tol=1e-15)


@pytest.mark.parametrize("p", [1e-3, 0.02, 0.3])
def test_coverage_is_at_least_nominal(p: float) -> None:
    """Exact coverage over every outcome k of n = 200: P(rate_high >= p) >= C and P(rate_low <= p) >= C."""
    n, c = 200, 0.95
    k = np.arange(n + 1)
    low, high = clopper_pearson_arrays(k, np.full(n + 1, n), c)
    pk = binom.pmf(k, n, p)
    assert pk[high >= p].sum() >= c - 1e-12
    assert pk[low <= p].sum() >= c - 1e-12


def test_no_executions_knows_nothing_and_bad_counts_raise() -> None:
    assert clopper_pearson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)
    with pytest.raises(ValueError):
        clopper_pearson(0, 5, confidence=1.0)


def test_device_and_family_rates_from_the_store(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        rows = [result("sim:1", family="gemm", t=NOW - 100 + i) for i in range(8)]
        rows += [result("sim:1", family="alu", passed=False, t=NOW - 50), result("sim:1", family="alu", t=NOW - 49)]
        rows += [result("sim:1", family="alu", passed=False, attempt=1, sticky=True, t=NOW - 48)]  # a retest
        scan(store, "sim:1", rows)
        scan(store, "sim:2", [result("sim:2", t=NOW - 10 * 86400)])  # outside a 7-day window
        rates = device_rates(store, since=NOW - 7 * 86400)
        assert set(rates) == {"sim:1"}
        r = rates["sim:1"]
        assert (r.overall.executions, r.overall.failures) == (10, 1)  # the retest is not an execution
        assert (r.families["alu"].executions, r.families["alu"].failures) == (2, 1)
        assert (r.families["gemm"].executions, r.families["gemm"].failures) == (8, 0)
        assert r.overall.rate == pytest.approx(0.1)
        assert (r.overall.rate_low, r.overall.rate_high) == pytest.approx(clopper_pearson(1, 10))
        assert r.overall.test_hours == pytest.approx(11 * 0.5 / 3600)  # testing time includes the retest
        assert r.overall.failures_per_test_hour == pytest.approx(1 / (11 * 0.5 / 3600))
        everything = device_rates(store)
        assert set(everything) == {"sim:1", "sim:2"}
        assert device_rates(store, devices=["sim:2"])["sim:2"].overall.executions == 1
        fleet = fleet_rates(store)
        assert (fleet.overall.executions, fleet.overall.failures) == (11, 1)
        assert set(fleet.families) == {"gemm", "alu"}
