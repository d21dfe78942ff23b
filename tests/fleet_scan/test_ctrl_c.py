"""Ctrl-C at any moment of a scan, as a terminal sends it (SIGINT to the scanner, its workers and any retest at
once): exit 130 with one line, never a traceback or "worker died", and a store whose scans all say ``interrupted``.
The moments are the scan's own milestones, read from its store and its JSON events, so the test never depends on
how fast the machine is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._scan import cores, env, store_rows

pytestmark = pytest.mark.slow


def _start(db: Path, tmp: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sdcguard", "--db", str(db), "scan", "--all", "--json", "--budget", "30s"]
        + ["--device", f"cpu:{cores()[0]}", "--lock-dir", str(tmp / "locks"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        start_new_session=True,  # its own process group: killpg reaches it as a terminal's Ctrl-C would
    )


def _count(db: Path, table: str) -> int:
    """Rows in ``table`` (0 while the store or its schema does not exist yet)."""
    if not db.exists() or not store_rows(db, "SELECT 1 FROM sqlite_master WHERE name = ?", (table,)):
        return 0
    return int(store_rows(db, f"SELECT COUNT(*) FROM {table}")[0][0])


def _wait_for(predicate, proc: subprocess.Popen[str], what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 120
    while not predicate():
        assert proc.poll() is None, f"the scan ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within 120 s"
        time.sleep(0.01)


def _ctrl_c(proc: subprocess.Popen[str]) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGINT)
    return proc.communicate(timeout=120)


def _assert_stopped(proc: subprocess.Popen[str], db: Path, err: str) -> None:
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "worker died" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().count("\n") == 0 and "interrupted" in err, err
    if db.exists() and store_rows(db, "SELECT 1 FROM sqlite_master WHERE name = 'scans'"):
        assert store_rows(db, "PRAGMA integrity_check") == [("ok",)]
        statuses = {s for (s,) in store_rows(db, "SELECT status FROM scans")}
        assert statuses <= {"interrupted"}, statuses


def test_ctrl_c_while_the_scanner_prepares_exits_130_and_records_nothing(tmp_path: Path) -> None:
    """The store exists, the references are being built: no worker yet, nothing recorded."""
    db = tmp_path / "fleet.db"
    proc = _start(db, tmp_path)
    _wait_for(db.exists, proc, "the store")
    out, err = _ctrl_c(proc)
    _assert_stopped(proc, db, err)
    assert '"started"' in out or _count(db, "scans") == 0


def test_ctrl_c_as_the_workers_start_exits_130_and_their_scans_say_interrupted(tmp_path: Path) -> None:
    """The worker's process is starting (its interpreter, its imports, its backend) when the signal reaches it:
    blocked until its handler is in place, then a flag its scan's loop reads."""
    db = tmp_path / "fleet.db"
    proc = _start(db, tmp_path)
    assert proc.stdout is not None
    # the first event is the references' note: the workers start right after it
    _wait_for(lambda: bool(proc.stdout.readline()), proc, "the first event")  # type: ignore[union-attr]
    out, err = _ctrl_c(proc)
    _assert_stopped(proc, db, err)


def test_ctrl_c_during_the_scan_keeps_what_ran(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    proc = _start(db, tmp_path)
    _wait_for(lambda: _count(db, "results") > 0, proc, "a result")
    out, err = _ctrl_c(proc)
    _assert_stopped(proc, db, err)
    ((status, executions),) = store_rows(db, "SELECT status, executions FROM scans")
    assert status == "interrupted" and executions > 0


@pytest.mark.parametrize(
    "args",
    [
        ["report"],
        ["incidents"],
        ["quarantine", "list"],
        ["quarantine", "add", "cpu:h:1", "--reason", "x", "--new"],
        ["policy"],
        ["prune", "--before", "30d"],
        ["export", "prometheus", "out.prom"],
        ["merge", "out.db", "in.db"],
    ],
)
def test_ctrl_c_in_any_command_exits_130_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """A Ctrl-C lands wherever the command is; here, in opening its store (every write is one transaction, rolled
    back by any exception, so the store is as it was)."""
    from click.testing import CliRunner

    from sdcguard.cli import cli
    from sdcguard.fleet.store.store import Store

    with Store.open(tmp_path / "in.db"):
        pass

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "open", interrupted)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "in.db"), *args])
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "sdcguard: interrupted", result.output
