"""Case order and budget of the fleet scanner (pure logic, property-tested)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from fleet_scan.device_scan.schedule import UNKNOWN_CASE_S, Budget, CaseClock, next_case, order_cases


@dataclass(frozen=True)
class _Case:
    id: str
    family: str


_families = st.sampled_from(["gemm", "alu", "ieee", "memory", "shared", "intrinsics"])
_suites = st.lists(_families, min_size=1, max_size=40).map(
    lambda fams: [_Case(id=f"{f}.{i}", family=f) for i, f in enumerate(fams)]
)


@given(_suites, st.dictionaries(_families, st.integers(0, 5)))
def test_order_is_a_permutation_touching_every_family_first(cases: list[_Case], past: dict[str, int]) -> None:
    plan = order_cases(cases, past)
    assert sorted(c.id for c in plan) == sorted(c.id for c in cases)
    families = {c.family for c in cases}
    # a budget that allows only len(families) executions still touches every family
    assert {c.family for c in plan[: len(families)]} == families
    # families that failed before come first, most failures first
    first_round = [c.family for c in plan[: len(families)]]
    keys = [-past.get(f, 0) for f in first_round]
    assert keys == sorted(keys)
    # within a family, the suite's order is kept
    for f in families:
        assert [c.id for c in plan if c.family == f] == [c.id for c in cases if c.family == f]


class _FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@given(st.floats(0.5, 20.0), st.lists(st.floats(0.001, UNKNOWN_CASE_S), min_size=1, max_size=12), st.floats(0.0, 0.2))
def test_budget_is_never_overrun_when_cases_keep_their_times(budget_s: float, times: list[float], flush: float) -> None:
    """The scan loop starts a case only when its (observed) time still fits: it never runs past the deadline."""
    cases = [_Case(id=f"c{i}", family=f"f{i % 3}") for i in range(len(times))]
    duration = {c.id: t for c, t in zip(cases, times)}
    clock = _FakeClock()
    budget = Budget(budget_s, clock=clock)
    budget.observe_flush(flush)
    estimates = CaseClock()
    budget.start()
    position, runs = 0, 0
    while (picked := next_case(cases, position, budget, estimates)) is not None:
        case, position = picked
        clock.t += duration[case.id]
        estimates.observe(case.id, duration[case.id])
        runs += 1
    clock.t += flush  # the final flush
    assert clock.t <= budget_s + 1e-9
    # and it fills the budget: whatever is left is less than the cheapest case (plus margins and the flush reserve)
    cheapest = min(times) * 1.3
    assert budget_s - clock.t <= max(cheapest, UNKNOWN_CASE_S) + budget.reserve_s + 1e-9
    assert runs >= 1 or budget_s - budget.reserve_s < UNKNOWN_CASE_S


def test_unknown_cases_are_assumed_slow_until_timed() -> None:
    clock = CaseClock()
    assert clock.estimate("x") == UNKNOWN_CASE_S
    clock.observe("x", 0.01)
    clock.observe("x", 0.02)
    assert 0.02 < clock.estimate("x") < 0.03
