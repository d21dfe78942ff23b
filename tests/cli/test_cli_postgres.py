"""The commands on a PostgreSQL store as a user runs them: ``--db postgresql://...`` and ``$SDCGUARD_DB``, a
password in the URL refused, ``db init|grant``, ``merge`` into the server, and a scan while the server is away
(spooled, then ``sdcguard forward``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.store.store import Store
from sdcguard.testing.postgres import PostgresServer
from tests._fleet import clean, result, scan

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), env=env)
    return r.exit_code, r.stdout, r.stderr


def test_report_from_a_server_by_flag_and_by_environment(pg_server: PostgresServer) -> None:
    url = pg_server.fresh_url()
    t = time.time() - 3600
    with Store.open(url) as s:
        scan(s, "sim:1", [*clean("sim:1", 20, t=t), result("sim:1", passed=False, t=t + 30)], t=t)
    code, out, err = _run("--db", url, "report", "--format", "json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert (row["device"], row["executions"], row["failures"], row["status"]) == ("sim:1", 21, 1, "suspect")
    code, out2, err = _run("report", "--format", "json", env={"SDCGUARD_DB": url})
    assert code == 0, err
    assert json.loads(out2) == json.loads(out)


def test_a_password_in_the_url_is_one_line_exit_2() -> None:
    code, _, err = _run("--db", "postgresql://ops:hunter2@db.example/sdcguard", "report")
    assert code == 2
    assert err.count("\n") == 1 and "pgpass" in err and "hunter2" not in err


def test_an_unreachable_server_is_one_line_exit_2(tmp_path: Path) -> None:
    code, _, err = _run("--db", f"postgresql:///sdcguard?host={tmp_path}&connect_timeout=2", "report")
    assert code == 2 and err.count("\n") == 1 and "cannot reach" in err


def test_db_init_grant_and_merge_into_the_server(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.fresh_url()
    code, out, err = _run("--db", url, "db", "init")
    assert code == 0 and "fleet store ready" in out, err
    code, out, err = _run("--db", url, "db", "grant", "scanner", "--print")
    assert code == 0, err
    assert "GRANT SELECT ON ALL TABLES" in out and "GRANT DELETE ON" in out
    code, out, err = _run("--db", url, "db", "grant", "scanner", "--reader", "--print")
    assert code == 0 and "INSERT" not in out, err
    node = tmp_path / "node.db"
    with Store.open(node) as s:
        scan(s, "sim:4", clean("sim:4", 7))
    for _ in range(2):
        code, out, err = _run("merge", url, str(node))
        assert code == 0, err
    assert "+0 scans" in out
    with Store.open(url) as s:
        assert [(t.device, t.executions) for t in s.counts.tallies(by="device")] == [("sim:4", 7)]


@pytest.mark.slow
def test_a_scan_while_the_server_is_away_is_spooled_then_forwarded(tmp_path: Path) -> None:
    """A real `sdcguard scan` (a CPU core, one second) with the server stopped: it passes (exit 0), says it
    spools, and the spool holds the scan; the server back, `forward` sends it, twice sends nothing more."""
    with PostgresServer() as server:
        url = server.fresh_url()
        Store.open(url).close()
        server.stop()
        env = {**os.environ, "SDCGUARD_SPOOL": str(tmp_path / "spool.db"), "PGCONNECT_TIMEOUT": "2"}
        p = subprocess.run(
            [sys.executable, "-m", "sdcguard", "--db", url, "scan", "--device", "cpu:0", "--budget", "1", "--all"],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=tmp_path,
        )
        assert p.returncode == 0, p.stderr
        assert "spool" in p.stderr + p.stdout
        with Store.open(tmp_path / "spool.db") as spool:
            ((device, executions),) = [(t.device, t.executions) for t in spool.counts.tallies(by="device")]
        assert executions > 0
        server.start()
        for expected in (1, 0):
            q = subprocess.run(
                [sys.executable, "-m", "sdcguard", "--db", url, "forward"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert q.returncode == 0, q.stderr
            assert f"+{expected} scans" in q.stdout
        with Store.open(url) as s:
            assert [(t.device, t.executions) for t in s.counts.tallies(by="device")] == [(device, executions)]


def test_libpq_settings_pass_through_tls_among_them(pg_server: PostgresServer) -> None:
    """The URL's libpq settings reach libpq as they are: sslmode=require against this server (which has no TLS)
    is refused by libpq, where the same URL without it reads the store; and PG* variables work as well."""
    schema = pg_server.fresh_url().split("search_path%3D")[1]
    url = pg_server.url(schema=schema, tcp=True)
    Store.open(url).close()
    code, _, err = _run("--db", url + "&sslmode=require", "report")
    assert code == 2 and "SSL" in err and err.count("\n") == 1
    code, _, err = _run("--db", url + "&sslmode=disable", "report", "--format", "json")
    assert code == 0, err
    code, _, err = _run("--db", url, "report", env={"PGSSLMODE": "require"})
    assert code == 2 and "SSL" in err


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("/sdcguard?", "/sdcgaurd?"), 'database "sdcgaurd" does not exist'),
        (("user=postgres", "user=nosuchrole"), 'role "nosuchrole" does not exist'),
    ],
)
def test_a_permanent_error_is_one_line_exit_2_and_nothing_spooled(
    pg_server: PostgresServer, tmp_path: Path, change: tuple[str, str], words: str
) -> None:
    """A typo'd database or role is no outage: the scan stops before scanning (exit 2), spools nothing, and every
    command says the same in one line; only a server that does not answer is spooled for (the test above)."""
    url = pg_server.fresh_url()
    assert change[0] in url
    bad = url.replace(*change)
    env = {"SDCGUARD_SPOOL": str(tmp_path / "spool.db")}
    for args in (
        ["scan", "--device", "cpu:0", "--budget", "1s", "--all", "--lock-dir", str(tmp_path / "locks")],
        ["report"],
        ["incidents"],
    ):
        code, _, err = _run("--db", bad, *args, env=env)
        assert code == 2, (args, err)
        assert err.count("\n") == 1 and words in err and "spool" not in err, (args, err)
    assert not (tmp_path / "spool.db").exists()


def test_a_missing_psycopg_names_the_extra(tmp_path: Path) -> None:
    """The light install (no [postgres] extra) with a server URL: one line naming what to install, exit 2."""
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from sdcguard.cli import main\n"
        "sys.argv = ['sdcguard', '--db', 'postgresql://db.example/sdcguard', 'report']\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "[postgres]" in p.stderr and "psycopg" in p.stderr, p.stderr
