"""The fleet store: round trips, atomic finish, stale scans, and refusing what is not a store (untouched)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.errors import BadInput, SchemaTooNew, StoreError
from sdcguard.fleet.store.schema.migrations import SCHEMA_VERSION
from sdcguard.fleet.store.store import Store
from sdcguard.records import CaseResult, DeviceInfo, Incident
from tests._fleet import NOW, result, scan, snapshot
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


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30)
@given(
    kind=st.text(_CHARS, min_size=1, max_size=20),
    step=st.integers(0, 2**40),
    ranks=st.lists(st.integers(0, 1023), max_size=4),
    detail=st.text(_CHARS, max_size=60),
    sticky=st.none() | st.booleans(),
    job=st.none() | st.text(_CHARS, max_size=10),
)
def test_incident_round_trip(
    new_store: Callable[[str], str],
    backend: str,
    kind: str,
    step: int,
    ranks: list[int],
    detail: str,
    sticky: bool | None,
    job: str | None,
) -> None:
    devices = tuple(f"sim:{r}" for r in ranks)
    inc = Incident(
        kind=kind,
        step=step,
        suspect_ranks=tuple(ranks),
        device=devices[0] if devices else None,
        detail=detail,
        devices=devices,
        hosts=tuple(f"h{r}" for r in ranks),
        parameter="layer.0.weight",
        sticky=sticky,
        job=job,
        time=NOW,
    )
    with Store.open(new_store(backend)) as store:
        iid = store.training.record_incident(inc)
        assert iid > 0
        assert store.training.incidents() == [inc]
        for d in devices:
            assert store.training.incidents(device=d) == [inc]


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


def test_quarantine_round_trip_with_history(store_db: str) -> None:
    with Store.open(store_db) as store:
        scan(store, "sim:1", [result("sim:1")])
        assert store.quarantine.status("sim:1", now=NOW) == "healthy"
        store.quarantine.add("sim:1", reason="MCE in dmesg", by="alice@ops", now=NOW)
        assert store.quarantine.status("sim:1") == "quarantined"
        with pytest.raises(BadInput, match="already quarantined"):
            store.quarantine.add("sim:1", reason="again")
        store.quarantine.release("sim:1", reason="board swapped", by="bob@ops", now=NOW + 10)
        assert store.quarantine.status("sim:1") == "probation"
        with pytest.raises(BadInput, match="not quarantined"):
            store.quarantine.release("sim:1", reason="twice")
        hist = store.quarantine.history("sim:1")
        assert [(h["action"], h["by"], h["reason"], h["time"]) for h in hist] == [
            ("quarantine", "alice@ops", "MCE in dmesg", NOW),
            ("release", "bob@ops", "board swapped", NOW + 10),
        ]
        with pytest.raises(BadInput, match="reason"):
            store.quarantine.add("sim:2", reason="  ")


# ---------------------------------------------------------------- refusing bad files, untouched
def test_text_file_is_refused_untouched(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("this is not a database\n" * 20)
    before = snapshot(p)
    with pytest.raises(StoreError, match="not a SQLite database"):
        Store.open(p)
    assert snapshot(p) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["notes.txt"]  # no -wal / -shm either


def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    p = tmp_path / "other.db"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    before = snapshot(p)
    with pytest.raises(StoreError, match="not an sdcguard fleet store"):
        Store.open(p)
    assert snapshot(p) == before


def test_future_schema_is_refused_untouched(tmp_path: Path) -> None:
    p = tmp_path / "future.db"
    Store.open(p).close()
    conn = sqlite3.connect(p)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = snapshot(p)
    with pytest.raises(SchemaTooNew, match="newer sdcguard"):
        Store.open(p)
    assert snapshot(p) == before


def test_missing_directory_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        Store.open(tmp_path / "nope" / "s.db")
    assert not (tmp_path / "nope").exists()


def test_missing_file_without_create_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no fleet store"):
        Store.open(tmp_path / "s.db", create=False)
    assert list(tmp_path.iterdir()) == []


def test_path_under_a_file_is_refused_untouched(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("x")
    before = snapshot(f)
    with pytest.raises(StoreError, match="is not a directory"):
        Store.open(f / "fleet.db")
    assert snapshot(f) == before


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="directory"):
        Store.open(tmp_path)


@pytest.mark.skipif(
    not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0, reason="root reads any file"
)
def test_unreadable_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    Store.open(p).close()
    p.chmod(0)
    with pytest.raises(StoreError, match="permission denied"):
        Store.open(p)


def test_a_result_row_names_every_column_of_the_insert() -> None:
    # rows are bound by column name: a column added to the table or reordered cannot shift the others
    from sdcguard.fleet.store.writes import results as results_module

    row = results_module.result_row(1, 0, result("sim:0"))
    assert set(row) == set(results_module.RESULT_COLUMNS)
    assert all(f":{c}" in results_module.INSERT_RESULT for c in results_module.RESULT_COLUMNS)
