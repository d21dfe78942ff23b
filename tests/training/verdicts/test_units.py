"""Where a fault that crossed a unit's collectives started (:func:`first_to_differ`), and the judgements kept there
(:func:`narrowed`): pure functions of the traces, checked against traces built from a known start."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdcguard.training.digest import Digest
from sdcguard.training.verdicts.attribution import Judgement
from sdcguard.training.verdicts.units import first_to_differ, join_units, narrowed


@st.composite
def spoiled(draw: st.DrawFn) -> tuple[dict[int, list[tuple[int, ...]]], set[int]]:
    """Traces of one micro-batch (slice -> its computations' traces) in which computation ``bad`` went wrong first
    at collective ``k`` on the slices ``started`` (their own computation), everything after it anywhere possibly
    spoiled by what they sent; and ``started``."""
    slices = draw(st.integers(1, 4))
    computations = draw(st.integers(2, 5))
    length = draw(st.integers(1, 6))
    base = {s: [draw(st.integers(0, 2**64 - 1)) for _ in range(length)] for s in range(slices)}
    bad = draw(st.integers(0, computations - 1))
    k = draw(st.integers(0, length - 1))
    started = draw(st.sets(st.integers(0, slices - 1), min_size=1))
    traces: dict[int, list[tuple[int, ...]]] = {}
    for s in range(slices):
        rows = []
        for c in range(computations):
            row = list(base[s])
            if c == bad:
                if s in started:
                    row[k] ^= draw(st.integers(1, 2**64 - 1))
                for i in range(k + 1, length):  # downstream: anything may differ, on any slice
                    row[i] ^= draw(st.sampled_from([0, 1, 1 << 63]))
            rows.append(tuple(row))
        traces[s] = rows
    return traces, started


@given(spoiled())
def test_the_slices_where_a_computation_first_differed_are_found(case: tuple[dict, set[int]]) -> None:
    traces, started = case
    assert first_to_differ(traces) == started


@given(spoiled())
def test_a_computation_no_tracer_saw_changes_nothing(case: tuple[dict, set[int]]) -> None:
    traces, started = case
    extra = {s: [*rows, ()] for s, rows in traces.items()}  # e.g. an original observed where nothing traced
    assert first_to_differ(extra) == started


@given(st.lists(st.tuples(*[st.integers(0, 9)] * 3), min_size=1, max_size=4))
def test_no_difference_places_nothing(rows: list[tuple[int, int, int]]) -> None:
    assert first_to_differ({s: [row, row, row] for s, row in enumerate(rows)}) == set()


def test_a_shorter_trace_differs_where_it_ends() -> None:
    assert first_to_differ({0: [(1, 2, 3), (1, 2)], 1: [(5, 6, 7), (5, 6, 8)]}) == {0, 1}
    assert first_to_differ({0: [(1, 2, 3), (1,)], 1: [(5, 6, 7), (5, 6, 8)]}) == {0}


BLAME = Digest(loss=1, units=(1,))


def _hardware(rank: int) -> Judgement:
    return Judgement(verdict="hardware", agreed=BLAME, blamed={rank: True}, original_corrupt=True, how="h")


def test_a_fault_that_crossed_the_tp_collective_is_named_where_it_started() -> None:
    """dp=3 x tp=2, units (0, 1), (2, 3), (4, 5): each slice names its member of the first unit; the traces place the
    start on slice 1: rank 1 alone, where the shards alone give the unit, unresolved."""
    unit_of = {r: (r - r % 2, r - r % 2 + 1) for r in range(6)}.__getitem__
    judged = [(0, 0, _hardware(0)), (1, 1, _hardware(1))]
    alone = join_units([(o, j) for _, o, j in judged], unit_of)
    assert [(j.verdict, j.suspects) for _, j in alone] == [("unresolved", (0, 1))]
    traced = join_units(narrowed(judged, {1}), unit_of)
    assert [(o, j.verdict, dict(j.blamed)) for o, j in traced] == [(1, "hardware", {1: True})]
    assert traced[0][1].original_corrupt and "first differed on rank 1" in traced[0][1].how


def test_traces_that_say_nothing_new_leave_the_judgements_alone() -> None:
    judged = [(0, 0, _hardware(0)), (1, 1, _hardware(1))]
    assert narrowed(judged, set()) == [(0, judged[0][2]), (1, judged[1][2])]
    assert narrowed(judged, {0, 1}) == [(0, judged[0][2]), (1, judged[1][2])]
    assert narrowed(judged, {2}) == [(0, judged[0][2]), (1, judged[1][2])]  # a slice that did not disagree


def test_a_lone_unresolved_slice_keeps_its_own_words() -> None:
    j = Judgement(verdict="unresolved", suspects=(1, 3), original_corrupt=True, how="no majority")
    ((owner, out),) = join_units([(1, j)], {r: (r - r % 2, r - r % 2 + 1) for r in range(4)}.__getitem__)
    assert (owner, out.suspects, out.how) == (1, (1, 3), "no majority")
