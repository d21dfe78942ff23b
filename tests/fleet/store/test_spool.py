"""A server store's spool: scan nodes and jobs write to the server, to their local spool while it cannot be reached,
and forwarding sends what the server lacks. Nothing lost, nothing twice, under any interleaving of outages
(beginning between two batches of a scan or before it), scans, incidents, prunes of the server and forwards; a
server killed mid-transaction; quarantine decided once by concurrent policy runs; a least-privilege writer role.

Outages are real: the writers reach the server through a door of their own, a folder whose socket is a link to the
server's. An outage takes the link away (a writer's connect finds no socket there, as when the server is gone) and
ends the writers' sessions (``pg_terminate_backend``). A role refused at login (``NOLOGIN``) would not do: the
server answers ``FATAL``, which the store takes for a wrong URL, an error rather than an outage.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard.errors import BadInput, StoreError
from sdcguard.fleet.store.spool import SpooledStore, forward
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from sdcguard.testing.postgres import PostgresServer
from tests._fleet import query, result

DAY = 86400.0
START = 20_000 * DAY
WRITER = "sdcguard_writer"


@pytest.fixture(scope="module")
def writer_role(pg_server: PostgresServer) -> str:
    """A role the writers log in as (all rights: the outage is what matters here), able to log in."""
    pg_server.admin(f"DROP ROLE IF EXISTS {WRITER}")
    pg_server.admin(f"CREATE ROLE {WRITER} LOGIN SUPERUSER")
    return WRITER


@pytest.fixture(scope="module")
def door(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The writers' way in: a folder holding a link to the server's socket (libpq's ``host=`` takes a folder)."""
    folder = tmp_path_factory.mktemp("door")
    os.chmod(folder, 0o755)
    _outage(pg_server, folder, WRITER, False)
    return folder


def _as(url: str, role: str, door: Path | None = None) -> str:
    """``url`` for ``role``, through ``door`` where given."""
    url = url.replace("user=postgres", f"user={role}")
    if door is None:
        return url
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query["host"] = str(door)
    return parts._replace(query=urllib.parse.urlencode(query)).geturl()


def _outage(server: PostgresServer, door: Path, role: str, down: bool) -> None:
    link = door / f".s.PGSQL.{server.port}"
    if down:
        link.unlink(missing_ok=True)
        server.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", params=(role,))
    elif not link.is_symlink():
        link.symlink_to(server.dir / link.name)


_batches = st.lists(
    st.lists(st.tuples(st.booleans(), st.integers(0, 2)), min_size=1, max_size=4), min_size=1, max_size=3
)
_op = st.one_of(
    st.tuples(st.just("scan"), st.integers(0, 2), _batches, st.none() | st.integers(0, 2), st.booleans()),
    st.tuples(st.just("incident"), st.integers(0, 2), st.just([]), st.none(), st.just(False)),
    st.tuples(st.sampled_from(["down", "up", "forward"]), st.just(0), st.just([]), st.none(), st.just(False)),
    st.tuples(st.just("prune"), st.integers(1, 3), st.just([]), st.none(), st.just(False)),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=1, max_size=14))
def test_nothing_lost_nothing_twice_under_any_interleaving(
    pg_server: PostgresServer, writer_role: str, door: Path, tmp_path_factory: pytest.TempPathFactory, ops: list
) -> None:
    admin = pg_server.fresh_url()
    url = _as(admin, writer_role, door)
    spool = tmp_path_factory.mktemp("spool") / "spool.db"
    ledger: Counter[tuple[str, str]] = Counter()  # (device, "executions" | "failures") as written
    incidents = 0
    clock = START
    Store.open(admin).close()
    try:
        for kind, n, batches, outage_after, finish in ops:
            clock += 0.6 * DAY
            if kind == "scan":
                device = f"sim:{n}"
                with SpooledStore(url, spool, retry_after_s=0) as w:
                    sid = w.scans.begin(device=device, host="node", budget_s=60.0, started_at=clock)
                    for b, batch in enumerate(batches):
                        rows = [
                            result(device, passed=p, case=f"c{c}", t=clock + b * 60 + i)
                            for i, (p, c) in enumerate(batch)
                        ]
                        w.scans.record(sid, rows, finish="complete" if finish and b == len(batches) - 1 else None)
                        ledger[(device, "executions")] += len(rows)
                        ledger[(device, "failures")] += sum(not p for p, _ in batch)
                        if outage_after == b:  # the server goes away between two batches of this scan
                            _outage(pg_server, door, writer_role, True)
            elif kind == "incident":
                device = f"sim:{n}"
                with SpooledStore(url, spool, retry_after_s=0) as w:
                    w.training.record_incident(
                        Incident(
                            kind="replay",
                            step=incidents,
                            suspect_ranks=(0,),
                            device=device,
                            detail="x",
                            devices=(device,),
                            hosts=("node",),
                            time=clock,
                        )
                    )
                incidents += 1
            elif kind in ("down", "up"):
                _outage(pg_server, door, writer_role, kind == "down")
            elif kind == "forward":
                SpooledStore(url, spool, retry_after_s=0).forward()  # nothing while the server is away
            elif kind == "prune":
                with Store.open(admin) as s:
                    s.maintenance.prune(before=clock - n * DAY)
    finally:
        _outage(pg_server, door, writer_role, False)
    for _ in range(2):  # forwarded twice: the second sends nothing
        forward(url, spool) if spool.exists() else None
    with Store.open(admin) as s:
        got = {(t.device, "executions"): t.executions for t in s.counts.tallies(by="device")}
        got |= {(t.device, "failures"): t.failures for t in s.counts.tallies(by="device")}
        assert {k: v for k, v in got.items() if v} == {k: v for k, v in ledger.items() if v}
        assert len(s.training.incidents()) == incidents
    assert query(admin, "SELECT COUNT(*) FROM incidents")[0][0] == incidents


def test_a_server_killed_mid_transaction_loses_nothing_and_a_spool_forwarded_twice_adds_nothing(tmp_path: Path) -> None:
    """A batch waits inside its transaction (another session holds the device's lock) when the server is killed;
    the writer goes on in the spool; once the server is back the spool, forwarded twice, completes the scan."""
    with PostgresServer() as server:
        url = server.fresh_url()
        spool = tmp_path / "spool.db"
        w = SpooledStore(url, spool)
        sid = w.scans.begin(device="sim:1", host="node", budget_s=60.0, started_at=START)
        w.scans.record(sid, [result("sim:1", t=START + i) for i in range(4)] + [result("sim:1", passed=False)])
        import psycopg

        from sdcguard.fleet.store.postgres.connection import lock_key

        blocker = psycopg.connect(url, autocommit=False)
        blocker.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("device", "sim:1"),))
        batch = threading.Thread(
            target=w.scans.record, args=(sid, [result("sim:1", t=START + 10 + i) for i in range(3)])
        )
        batch.start()
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
        for _ in range(600):
            if server.admin(waiting)[0][0]:
                break
            threading.Event().wait(0.05)
        assert server.admin(waiting)[0][0] == 1, "the batch never got inside its transaction"
        server.kill()
        batch.join(60)
        assert not batch.is_alive()
        w.scans.record(sid, [result("sim:1", t=START + 20 + i) for i in range(2)], finish="complete", total=10)
        w.close()
        with Store.open(spool, readonly=True) as s:  # the scan waits in the spool (sdcguard export spool)
            assert s.maintenance.backlog.scans == 1 and s.maintenance.backlog.last_forward is None
        server.start()
        first, second = forward(url, spool), forward(url, spool)
        assert first is not None and second is not None and second.results == second.scans == 0
        with Store.open(spool, readonly=True) as s:  # sent: nothing waits
            backlog = s.maintenance.backlog
            assert (backlog.scans, backlog.oldest) == (0, None) and backlog.last_forward is not None
        with Store.open(url) as s:
            (t,) = s.counts.tallies(by="device")
            assert (t.executions, t.failures) == (10, 1)
            (scan,) = s.scans.history()
            assert (scan["status"], scan["executions"], scan["total"]) == ("complete", 10, 10)


def test_a_training_job_spools_its_incidents_and_warns_once(
    pg_server: PostgresServer,
    writer_role: str,
    door: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The guard's responder on an unreachable server: nothing raised, both incidents in the spool, one
    warning; forwarded, the server has each once."""
    from sdcguard.training.response import Responder

    admin = pg_server.fresh_url()
    Store.open(admin).close()
    url = _as(admin, writer_role, door)
    monkeypatch.setenv("SDCGUARD_SPOOL", str(tmp_path / "job-spool.db"))
    incident = Incident(
        kind="replay",
        step=3,
        suspect_ranks=(1,),
        device="sim:7",
        detail="x",
        devices=("sim:7",),
        hosts=("h",),
        time=START,
    )
    _outage(pg_server, door, writer_role, True)
    try:
        responder = Responder("record", url, rank=0, writer=True, job="job-1")
        with caplog.at_level(logging.WARNING, logger="sdcguard.store"):
            responder.handle([incident])
            responder.handle([incident])
        assert len([r for r in caplog.records if "spool" in r.getMessage()]) == 1
    finally:
        _outage(pg_server, door, writer_role, False)
    forward(url, tmp_path / "job-spool.db")
    forward(url, tmp_path / "job-spool.db")
    with Store.open(admin) as s:
        assert s.training.incidents() == [incident, incident]


def test_two_policy_runs_at_once_quarantine_once(new_store: Callable[[str], str]) -> None:
    url = new_store("postgresql")
    Store.open(url).close()
    start = threading.Barrier(8)
    decided: list[int] = []

    def run() -> None:
        with Store.open(url) as s:
            start.wait()
            decided.append(len(s.quarantine.record_policy_run(now=START, quarantine={"sim:3": "sticky failure"})))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(decided) == [0] * 7 + [1]
    with Store.open(url) as s:
        assert [h["action"] for h in s.quarantine.history("sim:3")] == ["quarantine"]
        assert len(s.quarantine.decisions()) == 1


def test_a_writer_role_writes_scans_and_incidents_but_deletes_nothing(pg_server: PostgresServer) -> None:
    admin = pg_server.fresh_url()
    with Store.open(admin) as s:
        with pytest.raises(BadInput, match="no role"):
            s.maintenance.grant("nobody_here")
        pg_server.admin("DROP ROLE IF EXISTS sdcguard_scanner")
        pg_server.admin("CREATE ROLE sdcguard_scanner LOGIN")
        statements = s.maintenance.grant("sdcguard_scanner")
    assert any("GRANT INSERT, UPDATE ON ALL TABLES" in x for x in statements)
    url = _as(admin, "sdcguard_scanner")
    with Store.open(url) as w:
        sid = w.scans.begin(device="sim:1", host="h", budget_s=5.0, started_at=START)
        w.scans.record(sid, [result("sim:1", t=START), result("sim:1", passed=False, t=START + 1)], finish="complete")
        w.training.record_incident(
            Incident(
                kind="replay",
                step=1,
                suspect_ranks=(0,),
                device="sim:1",
                detail="x",
                devices=("sim:1",),
                hosts=("h",),
                time=START,
            )
        )
        assert [(t.executions, t.failures) for t in w.counts.tallies(by="device")] == [(2, 1)]
        with pytest.raises(StoreError, match="permission denied"):
            w.maintenance.prune(before=START + 30 * DAY)  # deleting scans and results is the owner's
    assert query(admin, "SELECT COUNT(*) FROM scans")[0][0] == 1


def test_a_spool_is_never_pruned(tmp_path: Path) -> None:
    with Store.open(tmp_path / "spool.db") as s:
        s.maintenance.mark_spool("postgresql://db.example/sdcguard")
        with pytest.raises(BadInput, match="spool"):
            s.maintenance.prune(before=START)


def test_a_spool_is_sent_to_its_own_server_only(
    pg_server: PostgresServer, writer_role: str, door: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers: a spool written while the first was away is refused by the second (one line, exit 2 from the
    CLI, nothing sent, the spool kept), no writer of the second adds to it, and the first gets it. Each server has
    a default spool of its own on one host."""
    from click.testing import CliRunner

    from sdcguard.cli import cli
    from sdcguard.fleet.store.spool import SpoolOfAnotherServer, default_spool

    monkeypatch.delenv("SDCGUARD_SPOOL", raising=False)
    admin = pg_server.fresh_url()
    Store.open(admin).close()
    url = _as(admin, writer_role, door)
    spool = tmp_path / "spool.db"
    incident = Incident(kind="replay", step=1, suspect_ranks=(0,), device="sim:1", detail="x", time=START)
    _outage(pg_server, door, writer_role, True)
    try:
        with SpooledStore(url, spool, retry_after_s=0) as w:
            w.training.record_incident(incident)
    finally:
        _outage(pg_server, door, writer_role, False)
    with PostgresServer() as other:
        elsewhere = other.fresh_url()
        Store.open(elsewhere).close()
        assert default_spool(elsewhere) != default_spool(url)
        assert default_spool(elsewhere).parent == default_spool(url).parent
        with pytest.raises(SpoolOfAnotherServer, match="holds writes for"):
            forward(elsewhere, spool)
        got = CliRunner().invoke(cli, ["--db", elsewhere, "forward", "--spool", str(spool)])
        assert got.exit_code == 2 and "not " + elsewhere in got.output and len(got.output.strip().splitlines()) == 1
        with pytest.raises(SpoolOfAnotherServer):
            SpooledStore(elsewhere, spool).spool()
        with Store.open(elsewhere) as s:
            assert s.training.incidents() == []
    assert spool.exists()
    assert forward(url, spool) is not None
    with Store.open(admin) as s:
        assert s.training.incidents() == [incident]
