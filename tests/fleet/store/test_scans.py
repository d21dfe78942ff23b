"""``store.scans``: results round trip, a device's known facts kept, an atomic finish, stale scans reaped, a
failed write leaving nothing, and the results row written by column name."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.errors import StoreError
from sdcguard.fleet.store.store import Store
from sdcguard.records import CaseResult, DeviceInfo
from tests._fleet import NOW, result, scan
from tests.conftest import BACKENDS

# PostgreSQL's text holds no NUL character and its UTF-8 no lone surrogate (the store's ids and texts never have
# either): neither backend gets one.
_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")


hexes = st.text("0123456789abcdef", min_size=1, max_size=16).map(lambda s: "0x" + s)


results_st = st.builds(
    CaseResult,
    device=st.sampled_from(["sim:0", "sim:1", "cpu:h:3"]),
    case=st.text(_CHARS, min_size=1, max_size=30),
    family=st.sampled_from(["gemm", "alu", "ieee", "memory"]),
    seed=st.integers(-(2**63), 2**63 - 1),
    passed=st.booleans(),
    duration_s=st.floats(0, 1e4, allow_nan=False),
    started_at=st.floats(0, 2e9, allow_nan=False),
    output_digest=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
    mismatches=st.integers(0, 2**31),
    element=st.none() | st.integers(0, 2**62),
    expected=st.none() | hexes,
    actual=st.none() | hexes,
    xor_mask=st.none() | hexes,
    location=st.none() | st.sampled_from(["sm:12", "core:3", "addr:0x7f00"]),
    attempt=st.integers(0, 5),
    sticky=st.none() | st.booleans(),
    detail=st.dictionaries(
        st.text(_CHARS, max_size=8), st.integers() | st.text(_CHARS, max_size=8) | st.booleans(), max_size=3
    ),
)


def _order(r: CaseResult) -> str:
    """A sort key that does not depend on the order of ``detail``'s keys (equal dicts, whatever their insertion
    order; CI once failed on two results alike but for ``detail`` ``{'0': 0, '': 0}``, which sorted by ``repr``
    came back in the other order)."""
    return repr(replace(r, detail=dict(sorted(r.detail.items()))))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40)
@given(st.lists(results_st, max_size=12), st.integers(0, 12))
def test_results_round_trip(new_store: Callable[[str], str], backend: str, results: list[CaseResult], cut: int) -> None:
    """Failed executions and retests come back as they went in; the passing first attempts of one case come back
    as one row holding their count, summed time and first and last start, however the batches were cut."""
    path = new_store(backend)
    with Store.open(path) as store:
        sid = store.scans.begin(device="sim:0", host="h", budget_s=None)
        store.scans.record(sid, results[:cut])
        store.scans.record(sid, results[cut:], finish="complete", total=len(results))
    with Store.open(path, create=False) as store:
        back = store.scans.results(scan_id=sid)
        individual = [r for r in results if not r.passed or r.attempt]
        assert sorted((r for r in back if not r.passed or r.attempt), key=_order) == sorted(individual, key=_order)
        # one row per (case, family): the strategy may give one case id two families
        folded = {(r.case, r.family): r for r in back if r.passed and not r.attempt}
        passes = [r for r in results if r.passed and not r.attempt]
        assert set(folded) == {(r.case, r.family) for r in passes}
        for key, row in folded.items():
            mine = [r for r in passes if (r.case, r.family) == key]
            first = min(r.started_at for r in mine)
            last = max(r.started_at for r in mine)
            assert row.executions == len(mine) and row.duration_s == pytest.approx(sum(r.duration_s for r in mine))
            assert row.started_at == first and (row.last_started_at or row.started_at) == last
        (row,) = store.scans.history()
        assert row["status"] == "complete" and row["total"] == len(results)
        assert row["executions"] == sum(not r.attempt for r in results)
        assert row["failures"] == sum(not r.passed and not r.attempt for r in results)


def test_device_upsert_keeps_known_facts(store_db: str) -> None:
    with Store.open(store_db) as store:
        store.scans.record_devices([DeviceInfo(id="sim:1", host="a", kind="sim", model="H100", index=1)], now=NOW)
        store.scans.record_devices([DeviceInfo(id="sim:1", host="b", kind="sim")], now=NOW + 5)
        (d,) = store.scans.devices()
        assert (d.host, d.model, d.index) == ("b", "H100", 1)


def test_finish_lands_with_results_and_finished_scan_refuses_more(store_db: str) -> None:
    with Store.open(store_db) as store:
        sid = scan(store, "sim:1", [result("sim:1")])
        with pytest.raises(StoreError, match="already complete"):
            store.scans.record(sid, [result("sim:1")])
        with pytest.raises(StoreError, match="no scan"):
            store.scans.record(9999, [result("sim:1")])
        assert len(store.scans.results()) == 1


def test_a_failed_write_leaves_nothing(store_db: str) -> None:
    with Store.open(store_db) as store:
        sid = store.scans.begin(device="sim:1", host="h", budget_s=10)
        bad = result("sim:1", passed=False)
        object.__setattr__(bad, "seed", object())  # not storable: the batch must fail as a whole
        with pytest.raises((sqlite3.Error, StoreError)):
            store.scans.record(sid, [result("sim:1"), bad], finish="complete")
        assert store.scans.results() == []
        assert store.scans.history()[0]["status"] == "running"


def test_reap_marks_stale_running_scans_interrupted(store_db: str) -> None:
    with Store.open(store_db) as store:
        old = store.scans.begin(device="sim:1", host="h", budget_s=60, started_at=NOW - 7200)
        fresh = store.scans.begin(device="sim:2", host="h", budget_s=60, started_at=NOW - 30)
        store.scans.record(old, [result("sim:1", passed=False)])
        assert store.scans.reap(now=NOW) == 1
        status = {s["id"]: s["status"] for s in store.scans.history()}
        assert status == {old: "interrupted", fresh: "running"}
        # The failure found before the scanner died still counts.
        assert store.quarantine.status("sim:1", now=NOW) == "suspect"


def test_a_result_row_names_every_column_of_the_insert() -> None:
    # rows are bound by column name: a column added to the table or reordered cannot shift the others
    from sdcguard.fleet.store.writes import results as results_module

    row = results_module.result_row(1, 0, result("sim:0"))
    assert set(row) == set(results_module.RESULT_COLUMNS)
    assert all(f":{c}" in results_module.INSERT_RESULT for c in results_module.RESULT_COLUMNS)
