"""Fire drills apart from the fleet's record (:mod:`sdcguard.fleet.store.drills`): where a drill's records go, what
refuses to mix the two, and how a merge keeps them apart."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.errors import BadInput
from sdcguard.fleet.merge import drills_left_out, merge_stores
from sdcguard.fleet.store.drills import (
    DRILL_ENV,
    drill_store_for,
    is_drill_store,
    open_for_drills,
    refuse_drill_store,
    store_in_use,
)
from sdcguard.fleet.store.spool import open_reader, open_writer
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo
from tests._fleet import NOW, assert_tallies_match_rows, clean, query, result, scan


def _real(path: Path, device: str = "gpu:n:0") -> None:
    with Store.open(path) as store:
        scan(store, device, [result(device), result(device, passed=False, sticky=True)])


def _drill(path: Path, device: str = "gpu:n:1") -> None:
    with open_for_drills(str(path)) as store:
        scan(store, device, [result(device, passed=False, sticky=True)])


def test_the_drill_store_sits_beside_the_fleets_unless_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SDCGUARD_DRILL_STORE", raising=False)
    assert drill_store_for(tmp_path / "fleet.db") == str(tmp_path / "fleet.drills.db")
    assert drill_store_for(tmp_path / "fleet.db", tmp_path / "mine.db") == str(tmp_path / "mine.db")
    monkeypatch.setenv("SDCGUARD_DRILL_STORE", str(tmp_path / "env.db"))
    assert drill_store_for(tmp_path / "fleet.db") == str(tmp_path / "env.db")
    monkeypatch.delenv("SDCGUARD_DRILL_STORE")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    a, b = drill_store_for("postgresql://h/fleetA"), drill_store_for("postgresql://h/fleetB")
    assert a != b and all(Path(p).parent == tmp_path / "state" / "sdcguard" for p in (a, b))


def test_a_drill_never_goes_into_a_store_holding_real_scans_nor_a_real_scan_into_a_drill_store(tmp_path: Path) -> None:
    real, drills = tmp_path / "fleet.db", tmp_path / "fleet.drills.db"
    _real(real)
    with pytest.raises(BadInput, match="holds real scans"):
        open_for_drills(str(real))
    with pytest.raises(BadInput, match="never a server"):
        open_for_drills("postgresql://h/fleet")
    _drill(drills)
    assert is_drill_store(drills) and not is_drill_store(real) and not is_drill_store(tmp_path / "none.db")
    with Store.open(drills) as store, pytest.raises(BadInput, match="is a drill store"):
        refuse_drill_store(store)


def test_a_training_drill_writes_and_reads_its_drill_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An injector marks its process a drill (``$SDCGUARD_DRILL``): its incidents and checkpoints go to the drill
    store and its reads come from there; without the mark, the fleet's store."""
    real = tmp_path / "fleet.db"
    with open_writer(real) as store:
        assert Path(store.path) == real
    monkeypatch.setenv(DRILL_ENV, "1")
    with open_writer(real) as store:
        assert Path(store.path) == tmp_path / "fleet.drills.db" and store.maintenance.holds_drills
    assert store_in_use(real) == str(tmp_path / "fleet.drills.db")
    assert store_in_use(tmp_path / "fleet.drills.db") == str(tmp_path / "fleet.drills.db")  # never .drills.drills
    with open_reader(real) as store:
        assert store.maintenance.holds_drills


def test_a_merge_keeps_drills_apart(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    _real(nodes / "a.db", "gpu:a:0")
    _drill(nodes / "a.drills.db", "gpu:a:0")
    fleet = tmp_path / "fleet.db"
    # from a directory: the drill store is left out, and said
    stats = merge_stores(fleet, [nodes])
    assert [Path(s.source).name for s in stats] == ["a.db"]
    assert drills_left_out(fleet, [nodes]) == [nodes / "a.drills.db"]
    with Store.open(fleet) as store:
        assert len(store.failures.executions(since=0)) == 1 and not store.maintenance.holds_drills
    # named: refused in one line
    with pytest.raises(BadInput, match="never goes into the fleet's record"):
        merge_stores(fleet, [nodes / "a.drills.db"])
    # drill stores into a new store make a drill store; a real store never goes into one
    merge_stores(tmp_path / "fleet.drills.db", [nodes / "a.drills.db"])
    assert is_drill_store(tmp_path / "fleet.drills.db")
    assert drills_left_out(tmp_path / "fleet.drills.db", [nodes]) == []
    with pytest.raises(BadInput, match="holds real scans and never goes into it"):
        merge_stores(tmp_path / "fleet.drills.db", [nodes])


def test_report_drills_reads_the_drill_store_and_says_so(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.db"
    _real(fleet)
    r = CliRunner().invoke(cli, ["--db", str(fleet), "report", "--drills"])
    assert r.exit_code == 2 and "no fire drill recorded" in r.output and len(r.output.strip().splitlines()) == 1
    _drill(tmp_path / "fleet.drills.db")
    r = CliRunner().invoke(cli, ["--db", str(fleet), "report", "--drills", "--format", "csv"])
    assert r.exit_code == 0 and "gpu:n:1" in r.output and "gpu:n:0" not in r.output, r.output
    r = CliRunner().invoke(cli, ["--db", str(fleet), "report", "--format", "csv"])
    assert r.exit_code == 0 and "gpu:n:0" in r.output and "gpu:n:1" not in r.output, r.output


@pytest.mark.slow
def test_a_drill_against_a_server_store_goes_to_a_local_drill_store(
    pg_server: object, new_store: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's drill on a PostgreSQL store: its results in this host's drill store for that server, none on the
    server; ``report --drills`` reads them."""
    from tests._scan import cores
    from tests._scan import scan as run_scan

    url = new_store("postgres")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    core = cores()[-1]
    proc = run_scan(url, tmp_path / "locks", "--device", f"cpu:{core}", "--inject", f"cpu:{core}:bitflip,rate=1.0")
    assert proc.returncode == 1, proc.stderr
    drills = Path(drill_store_for(url))
    assert drills.parent == tmp_path / "state" / "sdcguard" and f"the drill store {drills}" in proc.stderr
    with Store.open(url) as server, Store.open(drills) as local:
        assert server.maintenance.row_count("scans") == 0 and server.quarantine.entries() == []
        assert local.maintenance.row_count("scans") == 1 and local.maintenance.holds_drills
    r = CliRunner().invoke(cli, ["--db", url, "report", "--drills", "--format", "json"])
    assert r.exit_code == 0 and '"quarantined"' in r.output, r.output


def _record_as_before_drills_were_apart(store: Store, device: str, t: float) -> None:
    """A drill scan as an older release wrote it into the fleet's store: ``inject`` in its meta, failures counted."""
    store.scans.record_devices([DeviceInfo(id=device, host="node1", kind="gpu")], now=t)
    sid = store.scans.begin(
        device=device, host="node1", budget_s=60.0, started_at=t, meta={"inject": f"{device}:bitflip,rate=1.0"}
    )
    store.scans.record(
        sid,
        [result(device, passed=False, sticky=True, t=t + i, case=f"alu.c{i}", family="alu") for i in range(3)],
        finish="complete",
        finished_at=t + 60,
    )


def _fleet(path: str, *, with_drills: bool) -> None:
    """Real scans of two devices over two days; ``with_drills``: old drills of one of them in between."""
    with Store.open(path) as store:
        for day in (2, 1):
            t = NOW - day * 86_400
            scan(store, "gpu:n:0", clean("gpu:n:0", 4, t=t), t=t)
            if with_drills:
                _record_as_before_drills_were_apart(store, "gpu:n:1", t + 100)
            scan(
                store,
                "gpu:n:1",
                [*clean("gpu:n:1", 3, t=t + 200), *clean("gpu:n:1", 2, t=t + 210, family="alu")],
                t=t + 200,
            )


def _record(url: str) -> tuple[object, ...]:
    """What the fleet's record says: the report's rows and every tally table (testing seconds to the microsecond)."""
    r = CliRunner().invoke(cli, ["--db", url, "report", "--format", "json", "--since", "30d"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    tables = tuple(
        sorted(
            tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in query(url, f"SELECT * FROM {t}")
        )
        for t in ("day_tallies", "case_tallies", "case_totals", "family_tallies", "family_totals")
    )
    return rows, tables


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_older_stores_drills_move_to_the_drill_store_and_leave_the_record_as_if_never_run(
    backend: str, new_store: Callable[[str], str], tmp_path: Path
) -> None:
    """``db move-drills``: the fleet's report and tallies equal a twin store's that never ran the drills; the drill
    store holds them (``report --drills``); a second run moves nothing."""
    old, twin = new_store(backend), new_store(backend)
    _fleet(old, with_drills=True)
    _fleet(twin, with_drills=False)
    assert _record(old) != _record(twin)
    drills = tmp_path / "old.drills.db"
    r = CliRunner().invoke(cli, ["--db", old, "db", "move-drills", "--drill-store", str(drills)])
    assert r.exit_code == 0 and "moved 2 drill scan(s) (6 results) of 1 device(s)" in r.output, r.output
    assert _record(old) == _record(twin)
    assert_tallies_match_rows(old)
    with Store.open(drills) as store:
        assert store.maintenance.holds_drills and store.maintenance.row_count("scans") == 2
        assert len(store.scans.results(failed_only=True)) == 6
    assert_tallies_match_rows(drills)
    r = CliRunner().invoke(cli, ["--db", old, "db", "move-drills", "--drill-store", str(drills)])
    assert r.exit_code == 0 and "no drill scans" in r.output, r.output


def test_a_move_of_old_drills_cut_short_is_finished_by_the_next_and_never_into_a_real_store(
    new_store: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the merge into the drill store and the deletion from the fleet's: the drills are in both, and
    the next run leaves each once in the drill store and none in the fleet's. A real store named as the drill store
    is refused in one line, nothing moved."""
    from sdcguard.fleet.store.scans import Scans

    old, twin = new_store("sqlite"), new_store("sqlite")
    _fleet(old, with_drills=True)
    _fleet(twin, with_drills=False)
    r = CliRunner().invoke(cli, ["--db", old, "db", "move-drills", "--drill-store", twin])
    assert r.exit_code == 2 and "holds real scans" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    drills = tmp_path / "d.db"

    def killed(self: Scans, ids: object) -> tuple[int, int]:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Scans, "take_out", killed)
        r = CliRunner().invoke(cli, ["--db", old, "db", "move-drills", "--drill-store", str(drills)])
        assert r.exit_code == 130, r.output
    r = CliRunner().invoke(cli, ["--db", old, "db", "move-drills", "--drill-store", str(drills)])
    assert r.exit_code == 0 and "moved 2 drill scan(s)" in r.output, r.output
    assert _record(old) == _record(twin)
    with Store.open(drills) as store:
        assert store.maintenance.row_count("scans") == 2 and len(store.scans.results()) == 6
    assert_tallies_match_rows(drills)
