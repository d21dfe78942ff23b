"""The circuit breaker's denominator (``Store.case_coverage``): for the (case, bucket) pairs asked, the distinct
devices that ran the case in that bucket since ``since``, counted from the rows, on both backends. The report and
the policy ask only for the buckets their failures fell in (a 30-day report reads those buckets' rows, not the
window's), so a pair must count the same whatever else is asked beside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard.fleet.store.store import Store
from tests._fleet import result
from tests.conftest import BACKENDS

START = 20_000 * 86400.0  # a UTC midnight
BUCKET = 3600.0

# (device, case, second of a 10-hour span, attempt): integer seconds, so a bucket's edges are exact in both dialects;
# failures only, each its own row (the store folds a case's passing executions of one batch into one row)
_row = st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 36_000), st.integers(0, 1))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(_row, min_size=1, max_size=40),
    since_s=st.integers(0, 36_000),
    asked=st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 11)), max_size=8),
)
def test_coverage_of_the_buckets_asked_counts_the_devices_that_ran_the_case_there(
    new_store: Callable[[str], str], backend: str, rows: list, since_s: int, asked: list
) -> None:
    db = new_store(backend)
    since = START + since_s
    first = int(START // BUCKET)
    with Store.open(db) as s:
        for dev in {d for d, _, _, _ in rows}:
            sid = s.begin_scan(device=f"sim:{dev}", host="n0", budget_s=60.0, started_at=START)
            s.record_results(
                sid,
                [
                    result(f"sim:{dev}", case=f"c{c}", t=START + t, attempt=a, passed=False)
                    for d, c, t, a in rows
                    if d == dev
                ],
            )
        pairs = [(f"c{c}", first + b) for c, b in asked]
        got = {(x.case, x.bucket): x.devices for x in s.case_coverage(pairs, since=since, bucket_s=BUCKET)}
    want: dict[tuple[str, int], int] = {}
    for case, b in set(pairs):
        devices = {d for d, c, t, _ in rows if f"c{c}" == case and START + t >= since and (START + t) // BUCKET == b}
        if devices:
            want[(case, b)] = len(devices)
    assert got == want


def test_nothing_asked_counts_nothing(tmp_path: Path) -> None:
    with Store.open(str(tmp_path / "s.db")) as s:
        assert s.case_coverage([], since=0.0, bucket_s=BUCKET) == []
