"""The gradient's path into DDP's reduction, as a verdict (:func:`sdcguard.training.verdicts.local.reduction_incidents`,
rule 4, no processes): a rank is named alone exactly when its own comparison found a difference, sticky exactly when
the check before named it too, and a ``nonfinite`` incident of the same step is narrowed to the rank it names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdcguard.training.verdicts.local import explained, nonfinite_incidents, reduction_incidents

NAMES = ["a.weight", "a.bias", "b.weight"]
_row = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, len(NAMES)))


def _ids(n: int) -> list[tuple[int, str | None, str]]:
    return [(10 + i, f"sim:{i}", "host") for i in range(n)]


@given(st.lists(_row, min_size=1, max_size=8), st.sets(st.integers(10, 17), max_size=4))
def test_a_rank_is_named_alone_exactly_when_its_own_path_differed(
    rows: list[tuple[int, int, int]], before: set[int]
) -> None:
    found = reduction_incidents(7, rows, NAMES, _ids(len(rows)), "job", before=before)
    changed = [10 + i for i, (_, bad, _) in enumerate(rows) if bad > 0]
    assert [i.suspect_ranks for i in found] == [(r,) for r in changed]
    for inc in found:
        assert inc.kind == "reduction" and inc.step == 7 and inc.device == f"sim:{inc.suspect_ranks[0] - 10}"
        assert inc.sticky is (inc.suspect_ranks[0] in before)
        assert inc.parameter in [*NAMES, "<a parameter>"]


@given(st.integers(2, 6), st.data())
def test_a_nonfinite_gradient_every_replica_reduced_is_explained_by_the_rank_whose_path_changed(
    world: int, data: st.DataObject
) -> None:
    faulty = data.draw(st.integers(0, world - 1))
    rows = [(3, int(i == faulty), 0) for i in range(world)]
    ids = _ids(world)
    nonfinite = nonfinite_incidents(7, [(0, 1)] * world, ids, None)  # every replica reduced the infinity
    out = explained([*reduction_incidents(7, rows, NAMES, ids, None), *nonfinite])
    assert [i.suspect_ranks for i in out] == [(10 + faulty,), (10 + faulty,)]
