"""The circuit breaker's denominator (``store.failures.case_coverage``): for the (case, bucket) pairs asked, the
distinct devices that ran the case in that bucket since ``since``, counted from the rows, on both backends. The report
and the policy ask only for the buckets their failures fell in (a 30-day report reads those buckets' rows, not the
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
    caps=st.lists(st.one_of(st.none(), st.integers(1, 4)), min_size=8, max_size=8),
)
def test_coverage_of_the_buckets_asked_counts_the_devices_that_ran_the_case_there(
    new_store: Callable[[str], str], backend: str, rows: list, since_s: int, asked: list, caps: list
) -> None:
    """Exactly, or up to ``enough`` where asked: then ``min(devices, enough)`` (a cap of 1 to 4 devices over up
    to 6 devices with up to 40 rows: the first ``8 * enough`` rows hold them, or not, or are all the rows)."""
    db = new_store(backend)
    since = START + since_s
    first = int(START // BUCKET)
    with Store.open(db) as s:
        for dev in {d for d, _, _, _ in rows}:
            sid = s.scans.begin(device=f"sim:{dev}", host="n0", budget_s=60.0, started_at=START)
            s.scans.record(
                sid,
                [
                    result(f"sim:{dev}", case=f"c{c}", t=START + t, attempt=a, passed=False)
                    for d, c, t, a in rows
                    if d == dev
                ],
            )
        pairs = [(f"c{c}", first + b) for c, b in asked]
        enough = {p: cap for p, cap in zip(pairs, caps) if cap is not None}
        got = {(x.case, x.bucket): x.devices for x in s.failures.case_coverage(pairs, since=since, bucket_s=BUCKET)}
        capped = {
            (x.case, x.bucket): x.devices
            for x in s.failures.case_coverage(pairs, since=since, bucket_s=BUCKET, enough=enough)
        }
    want: dict[tuple[str, int], int] = {}
    for case, b in set(pairs):
        devices = {d for d, c, t, _ in rows if f"c{c}" == case and START + t >= since and (START + t) // BUCKET == b}
        if devices:
            want[(case, b)] = len(devices)
    assert got == want
    assert capped == {p: min(n, enough.get(p, n)) for p, n in want.items()}


def test_nothing_asked_counts_nothing(tmp_path: Path) -> None:
    with Store.open(str(tmp_path / "s.db")) as s:
        assert s.failures.case_coverage([], since=0.0, bucket_s=BUCKET) == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cap, want", [(1, 1), (2, 2), (3, 3), (4, 3), (30, 3)])
def test_a_capped_count_past_one_devices_many_rows_still_finds_the_others(
    new_store: Callable[[str], str], backend: str, cap: int, want: int
) -> None:
    """One device's 20 rows come first in the index, then two other devices': a cap of 2 reads 16 rows of one
    device and must count on (the rows are not all read, the devices are not enough)."""
    with Store.open(new_store(backend)) as s:
        for dev, times in (("sim:0", range(20)), ("sim:1", [30]), ("sim:2", [31])):
            sid = s.scans.begin(device=dev, host="n0", budget_s=60.0, started_at=START)
            s.scans.record(sid, [result(dev, case="c0", t=START + t, passed=False) for t in times])
        b = int(START // BUCKET)
        (got,) = s.failures.case_coverage([("c0", b)], since=START, bucket_s=BUCKET, enough={("c0", b): cap})
    assert got.devices == want
