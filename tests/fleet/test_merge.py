"""Merging per-node stores: a property test of idempotence and order independence, and schema migration."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.errors import StoreError
from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.store.schema.migrations import SCHEMA_VERSION
from sdcguard.fleet.store.schema.tables import APPLICATION_ID
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, query, result

# One node's history: scans of (device number, [passed...], finished?) and incidents naming device numbers.
node = st.tuples(
    st.lists(st.tuples(st.integers(0, 3), st.lists(st.booleans(), max_size=5), st.booleans()), max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
    st.lists(st.integers(0, 3), max_size=2, unique=True),
)


def _fill(path: Path, spec: tuple[list, list, list], tag: str) -> None:
    scans, incidents, quarantined = spec
    with Store.open(path) as store:
        for i, (dev, passes, finished) in enumerate(scans):
            d = f"sim:{dev}"
            sid = store.scans.begin(device=d, host=tag, budget_s=10.0, started_at=NOW - 1000 + i)
            store.scans.record(
                sid,
                [result(d, passed=p, t=NOW - 900 + j) for j, p in enumerate(passes)],
                finish="complete" if finished else None,
            )
        for k, dev in enumerate(incidents):
            store.training.record_incident(
                Incident(
                    kind="replay",
                    step=k,
                    suspect_ranks=(dev,),
                    device=f"sim:{dev}",
                    detail=tag,
                    devices=(f"sim:{dev}",),
                    hosts=(tag,),
                    time=NOW - 50 + k,
                )
            )
            store.training.record_checkpoint(
                checkpoint_id=f"{tag}/step{k}", step=k, verified=k % 2 == 0, job=tag, now=NOW - 40 + k
            )
        for dev in quarantined:
            store.quarantine.add(f"sim:{dev}", reason=f"by {tag}", by=tag, now=NOW)


def _content(path: str | Path) -> dict[str, list[tuple]]:
    """What a merge must carry, read from a store on either backend."""
    return {
        "results": sorted(
            query(
                path,
                "SELECT sc.uuid, r.seq, r.device, r.passed, r.executions FROM results r "
                "JOIN scans sc ON sc.id = r.scan",
            )
        ),
        "scans": sorted(query(path, "SELECT uuid, status, executions, failures FROM scans")),
        "incidents": sorted(
            query(path, "SELECT i.uuid, d.device FROM incidents i JOIN incident_devices d ON d.incident = i.id")
        ),
        "history": sorted(query(path, "SELECT uuid FROM quarantine_history")),
        "quarantine": sorted(query(path, "SELECT device, state FROM quarantine")),
        "checkpoints": sorted(query(path, "SELECT uuid, checkpoint_id, step, verified FROM checkpoints")),
    }


@settings(max_examples=15)
@given(node, node)
def test_merge_is_idempotent_and_order_independent(
    tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[str], str], a, b
) -> None:
    _idempotent(tmp_path_factory, new_store, "sqlite", a, b)


@settings(max_examples=8)
@given(node, node)
def test_merge_into_a_server_is_idempotent_and_order_independent(
    tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[str], str], a, b
) -> None:
    _idempotent(tmp_path_factory, new_store, "postgresql", a, b)


def _idempotent(tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[str], str], backend: str, a, b) -> None:
    """(``backend``: the merge's output; the inputs are node stores, SQLite files.)"""
    d = tmp_path_factory.mktemp("merge")
    pa, pb = d / "a.db", d / "b.db"
    ab, ba_out = new_store(backend), new_store(backend)
    _fill(pa, a, "node-a")
    _fill(pb, b, "node-b")
    merge_stores(ab, [pa, pb])
    once = _content(ab)
    stats = merge_stores(ab, [pb, pa, pa])
    assert all(s.results == s.scans == s.incidents == s.quarantine_history == 0 for s in stats)
    assert _content(ab) == once
    merge_stores(ba_out, [pb, pa])
    ba = _content(ba_out)
    assert {k: v for k, v in ba.items() if k != "quarantine"} == {k: v for k, v in once.items() if k != "quarantine"}
    # Nothing lost: every input row is in the merge.
    for p in (pa, pb):
        part = _content(p)
        for key in ("results", "scans", "incidents", "history"):
            assert set(part[key]) <= set(once[key])
    assert len(once["results"]) == len(_content(pa)["results"]) + len(_content(pb)["results"])


def test_a_fresh_store_is_stamped_and_a_blank_one_migrates(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    Store.open(p).close()
    header = p.read_bytes()[:100]
    assert int.from_bytes(header[60:64], "big") == SCHEMA_VERSION
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    # An empty file (e.g. `touch fleet.db`) becomes a store when created on purpose.
    blank = tmp_path / "blank.db"
    blank.write_bytes(b"")
    Store.open(blank).close()
    conn = sqlite3.connect(blank)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_merge_refuses_an_older_schema_without_touching_it(tmp_path: Path) -> None:
    p = tmp_path / "old.db"
    Store.open(p).close()
    conn = sqlite3.connect(p)
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    conn.close()
    before = p.read_bytes()
    with pytest.raises(StoreError, match="older schema"):
        merge_stores(tmp_path / "out.db", [p])
    assert p.read_bytes() == before


def test_a_version_1_store_migrates_forward_keeping_its_rows(tmp_path: Path) -> None:
    from sdcguard.fleet.store.schema.migrations import SQLITE_MIGRATIONS

    p = tmp_path / "v1.db"
    conn = sqlite3.connect(p, isolation_level=None)
    conn.execute("BEGIN")
    SQLITE_MIGRATIONS[1](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(
        "INSERT INTO scans(uuid, device, host, started_at, status) VALUES ('u1', 'sim:1', 'h', 1.0, 'complete')"
    )
    conn.execute(
        "INSERT INTO results(scan, seq, device, case_id, family, seed, passed, duration_s, started_at) "
        "VALUES (1, 0, 'sim:1', 'alu.a', 'alu', 1, 0, 0.1, 2.0)"
    )
    conn.execute("COMMIT")
    conn.close()
    with Store.open(p) as store:
        from sdcguard.fleet.rates import device_rates

        r = device_rates(store)["sim:1"].overall
        assert (r.executions, r.failures) == (1, 1)
    with sqlite3.connect(p) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert c.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'results_retests'").fetchone()[0] == 1


# ---------------------------------------------------------------- incremental merges
# (what happens on a node, which node, its argument, whether a merge follows)
_step = st.tuples(
    st.sampled_from(["begin", "record", "record", "finish", "incident", "quarantine"]),
    st.integers(0, 1),
    st.integers(0, 2),
    st.booleans(),
)


def _full_content(path: str | Path) -> dict[str, list[tuple]]:
    content = _content(path)
    content["rows"] = sorted(
        query(
            path,
            "SELECT sc.uuid, r.seq, r.executions, r.duration_s, r.started_at, r.last_started_at FROM results r "
            "JOIN scans sc ON sc.id = r.scan",
        ),
        key=repr,
    )
    content["scans"] = sorted(query(path, "SELECT uuid, status, executions, failures, total FROM scans"), key=repr)
    return content


@settings(max_examples=30)
@given(st.lists(_step, max_size=20))
def test_incremental_merges_end_where_one_full_merge_does(
    tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[str], str], steps
) -> None:
    """Whatever happened on the nodes between merges (scans left running and finished later, passing rows that
    kept growing), merging only what is new each time gives the same store as one merge of everything; and one
    more merge adds nothing."""
    _incremental(tmp_path_factory, new_store, "sqlite", steps)


@settings(max_examples=10)  # a merge into the server costs ~100 round trips: fewer examples, the same property
@given(st.lists(_step, max_size=20))
def test_incremental_merges_into_a_server_end_where_one_full_merge_does(
    tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[str], str], steps
) -> None:
    """The same, merging into a PostgreSQL store."""
    _incremental(tmp_path_factory, new_store, "postgresql", steps)


def _incremental(
    tmp_path_factory: pytest.TempPathFactory, new_store: Callable[[str], str], backend: str, steps: list
) -> None:
    """(``backend``: the merges' outputs; the nodes are SQLite files.)"""
    d = tmp_path_factory.mktemp("inc")
    inc, full_out = new_store(backend), new_store(backend)
    nodes = [d / "n0.db", d / "n1.db"]
    stores = [Store.open(p) for p in nodes]
    open_scans: list[list[tuple[int, str]]] = [[], []]
    clock = [NOW - 5000.0]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    try:
        for kind, n, arg, merge_after in steps:
            s = stores[n]
            if kind == "begin" or (kind == "record" and not open_scans[n]):
                dev = f"sim:{n}{arg}"
                open_scans[n].append(
                    (s.scans.begin(device=dev, host=f"node{n}", budget_s=10.0, started_at=tick()), dev)
                )
            if kind == "record":
                sid, dev = open_scans[n][-1]
                s.scans.record(sid, [result(dev, passed=i != arg, t=tick()) for i in range(3)])
            elif kind == "finish" and open_scans[n]:
                sid, _ = open_scans[n].pop(0)
                s.scans.finish(sid, "complete" if arg else "preempted", finished_at=tick())
            elif kind == "incident":
                dev = f"sim:{n}{arg}"
                s.training.record_incident(
                    Incident(
                        kind="replay",
                        step=int(tick()),
                        suspect_ranks=(arg,),
                        device=dev,
                        detail="x",
                        devices=(dev,),
                        hosts=(f"node{n}",),
                        time=clock[0],
                    )
                )
            elif kind == "quarantine":
                dev = f"sim:{n}{arg}"
                if dev not in {e.device for e in s.quarantine.entries()}:
                    s.quarantine.add(dev, reason="by hand", by="ops", now=tick())
            if merge_after:
                merge_stores(inc, nodes)
        merge_stores(inc, nodes)
    finally:
        for s in stores:
            s.close()
    merge_stores(full_out, nodes)
    assert _full_content(inc) == _full_content(full_out)
    again = merge_stores(inc, nodes)
    assert all(x.scans == x.results == x.incidents == x.quarantine_history == x.devices == 0 for x in again)
    assert _full_content(inc) == _full_content(full_out)
    assert _full_content(inc) == _full_content(full_out)
    # --full reads everything again and still counts nothing twice
    merge_stores(inc, nodes, full=True)
    assert _full_content(inc) == _full_content(full_out)


def test_a_merge_reads_only_what_is_new(tmp_path: Path) -> None:
    node = tmp_path / "node.db"
    with Store.open(node) as s:
        for i in range(30):
            sid = s.scans.begin(device="sim:1", host="n", budget_s=1.0, started_at=NOW - 10_000 + i)
            s.scans.record(sid, [result("sim:1", t=NOW - 10_000 + i)], finish="complete")
    (first,) = merge_stores(tmp_path / "fleet.db", [node])
    assert (first.scans, first.results) == (30, 30)
    with Store.open(node) as s:
        sid = s.scans.begin(device="sim:1", host="n", budget_s=1.0, started_at=NOW - 100)
        s.scans.record(sid, [result("sim:1", t=NOW - 100)])  # left running: taken again at the next merge
    (second,) = merge_stores(tmp_path / "fleet.db", [node])
    assert (second.scans, second.results) == (1, 1)
    with Store.open(node) as s:
        s.scans.record(sid, [result("sim:1", t=NOW - 99)] * 4, finish="complete")
    (third,) = merge_stores(tmp_path / "fleet.db", [node])
    assert (third.scans, third.results) == (0, 0)  # the same row, grown to 5 executions
    with Store.open(tmp_path / "fleet.db", create=False) as f:
        (latest,) = [x for x in f.scans.history() if x["started_at"] == NOW - 100]
        assert (latest["status"], latest["executions"], latest["total"]) == ("complete", 5, None)
        assert f.counts.tallies(by="device")[0].executions == 35
