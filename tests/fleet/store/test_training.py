"""``store.training``: the checkpoints the training guard saved (round trip, bad input, migrations), the scrubs of
checkpoints at rest, and incidents (round trip, a field this version does not know)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.errors import BadInput
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW
from tests.conftest import BACKENDS

entries = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=40),
        st.integers(0, 2**40),
        st.booleans(),
        st.text(alphabet="0123456789abcdef", max_size=16),
        st.one_of(st.none(), st.text(max_size=10)),
    ),
    max_size=6,
)


@settings(max_examples=30, deadline=None)
@given(entries)
def test_checkpoints_round_trip_in_order(tmp_path_factory: pytest.TempPathFactory, rows) -> None:
    path = tmp_path_factory.mktemp("ckpt") / "fleet.db"
    with Store.open(path) as store:
        for k, (cid, step, verified, digest, job) in enumerate(rows):
            store.training.record_checkpoint(
                checkpoint_id=cid, step=step, verified=verified, digest=digest, job=job, now=1000.0 + k
            )
    with Store.open(path, create=False) as store:
        back = store.training.checkpoints()
        assert [(c.checkpoint_id, c.step, c.verified, c.digest, c.job, c.time) for c in back] == [
            (cid, step, verified, digest, job, 1000.0 + k) for k, (cid, step, verified, digest, job) in enumerate(rows)
        ]
        for job in {r[4] for r in rows if r[4] is not None}:
            assert [c.job for c in store.training.checkpoints(job=job)] == [r[4] for r in rows if r[4] == job]
        assert len(store.training.checkpoints(since=1000.0 + len(rows) - 1)) == min(1, len(rows))


def test_a_checkpoint_needs_an_id(tmp_path: Path) -> None:
    with Store.open(tmp_path / "fleet.db") as store, pytest.raises(BadInput, match="needs an id"):
        store.training.record_checkpoint(checkpoint_id="", step=1, verified=True)


def test_a_schema_4_store_gains_the_checkpoints_table(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with Store.open(path) as store:
        store.training.record_checkpoint(checkpoint_id="c0", step=0, verified=True, now=5.0)
    with sqlite3.connect(path) as conn:  # as a version-4 sdcguard left it
        conn.execute("DROP TABLE checkpoints")
        conn.execute("PRAGMA user_version = 4")
    with Store.open(path) as store:
        assert store.training.checkpoints() == []
        store.training.record_checkpoint(checkpoint_id="c1", step=1, verified=False, now=6.0)
        assert [c.checkpoint_id for c in store.training.checkpoints()] == ["c1"]


def test_a_schema_10_store_keeps_its_scrubs_and_gains_the_unverified_outcome(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    with Store.open(path) as store:
        store.training.record_scrub(checkpoint_id="c0", status="clean", tensors=3, bytes=100, now=5.0)
        store.training.record_scrub(checkpoint_id="c1", status="corrupt", tensors=3, bytes=100, bad=["w"], now=6.0)
    with sqlite3.connect(path) as conn:  # as a version-10 sdcguard left it: no unverified outcome, no such column
        conn.execute("ALTER TABLE checkpoint_scrubs RENAME TO new")
        conn.execute(
            "CREATE TABLE checkpoint_scrubs (id INTEGER PRIMARY KEY, uuid TEXT NOT NULL UNIQUE, checkpoint_id TEXT "
            "NOT NULL, status TEXT NOT NULL CHECK (status IN ('clean','corrupt','unreadable')), tensors INTEGER NOT "
            "NULL, bytes INTEGER NOT NULL, bad TEXT NOT NULL DEFAULT '[]', detail TEXT NOT NULL DEFAULT '', host "
            "TEXT NOT NULL, time REAL NOT NULL)"
        )
        conn.execute(
            "INSERT INTO checkpoint_scrubs SELECT id, uuid, checkpoint_id, status, tensors, bytes, bad, detail, host, "
            "time FROM new"
        )
        conn.execute("DROP TABLE new")
        conn.execute("CREATE INDEX checkpoint_scrubs_checkpoint ON checkpoint_scrubs(checkpoint_id, time)")
        conn.execute("PRAGMA user_version = 10")
    with Store.open(path) as store:
        assert [(s.checkpoint_id, s.status, s.bad, s.unverified) for s in store.training.scrubs()] == [
            ("c0", "clean", (), ()),
            ("c1", "corrupt", ("w",), ()),
        ]
        store.training.record_scrub(
            checkpoint_id="c2", status="unverified", tensors=2, bytes=90, unverified=["b"], now=7.0
        )
        assert store.training.scrubs(checkpoint_id="c2")[0].unverified == ("b",)
        with pytest.raises(BadInput, match="clean, corrupt, unverified or unreadable"):
            store.training.record_scrub(checkpoint_id="c3", status="fine", tensors=0, bytes=0)


# PostgreSQL's text holds no NUL character and its UTF-8 no lone surrogate (the store's ids and texts never have
# either): neither backend gets one.
_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")


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


T0 = 1_800_000_000.0


def test_an_incident_with_a_field_this_version_does_not_know_still_reads(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        store.training.record_incident(
            Incident(
                kind="replay",
                step=3,
                suspect_ranks=(0,),
                device="sim:0",
                detail="d",
                devices=("sim:0",),
                hosts=("h",),
                time=T0,
            )
        )
    conn = sqlite3.connect(tmp_path / "s.db")
    record = json.loads(conn.execute("SELECT record FROM incidents").fetchone()[0])
    conn.execute("UPDATE incidents SET record = ?", (json.dumps({**record, "opinions": [1, 2, 3]}),))
    conn.commit()
    conn.close()
    with Store.open(tmp_path / "s.db") as store:
        (inc,) = store.training.incidents()
        assert (inc.kind, inc.step, inc.device) == ("replay", 3, "sim:0")
