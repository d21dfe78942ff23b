"""A store this user may not write: reading commands read it, writing commands say it is read-only (exit 2).

The tests run as root here, and root writes any file whatever its mode, so a chmod proves nothing by itself:
each command runs in a forked child that dropped to an unprivileged user (``nobody``) first, where the kernel
really refuses the writes. (As another user the test runs the commands directly.)
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, clean, result, scan, snapshot

NOBODY = 65534
ROOT_USER = os.geteuid() == 0


def _invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def as_user(*args: str) -> tuple[int, str, str]:
    """``sdcguard ARGS`` as an unprivileged user: (exit code, stdout, stderr)."""
    if not ROOT_USER:
        return _invoke(*args)
    _warm_up()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no privileges, then the command
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            payload = json.dumps(_invoke(*args))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            payload = json.dumps([99, "", f"child failed: {type(e).__name__}: {e}"])
        os.write(write, payload.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    code, out, err = json.loads(data)
    return int(code), out, err


_WARM: list[bool] = []


def _warm_up() -> None:
    """Run every command once as root on a scratch store: the modules each imports lazily are loaded before a
    child drops privileges (the interpreter's own files may be unreadable to the unprivileged user)."""
    if _WARM:
        return
    d = Path(tempfile.mkdtemp())
    db = _store(d / "w.db")
    other = _store(d / "o.db")
    for args in (
        ["report"],
        ["report", "--format", "json"],
        ["quarantine", "list"],
        ["quarantine", "history"],
        ["quarantine", "decisions"],
        ["incidents"],
        ["checkpoints"],
        ["export", "prometheus", str(d / "p")],
        ["quarantine", "add", "sim:2", "--reason", "x"],
        ["prune", "--before", "30d"],
        ["policy"],
        ["quarantine", "add", "sim:9", "--reason", "x"],
    ):
        _invoke("--db", str(db), *args)
    _invoke("merge", str(db), str(other))
    _invoke("--db", str(d / "missing" / "x.db"), "report")
    shutil.rmtree(d)
    _WARM.append(True)


@pytest.fixture()
def place() -> Iterator[Path]:
    """A directory the unprivileged user can reach (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="sdcguard-ro-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for p in d.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(d, ignore_errors=True)


def _store(path: Path) -> Path:
    with Store.open(path) as store:
        scan(store, "sim:1", [*clean("sim:1", 20), result("sim:1", passed=False, t=NOW - 3000)])
        scan(store, "sim:2", clean("sim:2", 10))
    return path


def _read_only_file(place: Path) -> Path:
    d = place / "rofile"
    d.mkdir()
    db = _store(d / "fleet.db")
    db.chmod(0o444)
    if ROOT_USER:
        os.chown(d, NOBODY, NOBODY)  # the directory is the user's, the file is root's and read-only
    return db


def _read_only_dir(place: Path) -> Path:
    d = place / "rodir"
    d.mkdir()
    db = _store(d / "fleet.db")
    if ROOT_USER:
        os.chown(db, NOBODY, NOBODY)  # the file is the user's, the directory is not
    d.chmod(0o555)
    return db


@pytest.mark.parametrize("make", [_read_only_file, _read_only_dir], ids=["read-only file", "read-only directory"])
def test_reading_commands_read_a_store_they_may_not_write(place: Path, make: object) -> None:
    db = make(place)
    before = snapshot(db)
    code, out, err = as_user("--db", str(db), "report", "--format", "json")
    assert code == 0, err
    assert {r["device"]: r["failures"] for r in json.loads(out)} == {"sim:1": 1, "sim:2": 0}
    out_dir = place / "out"
    out_dir.mkdir()
    if ROOT_USER:
        os.chown(out_dir, NOBODY, NOBODY)
    for args in (
        ["quarantine", "list"],
        ["quarantine", "history"],
        ["quarantine", "decisions"],
        ["incidents"],
        ["checkpoints"],
        ["export", "prometheus", str(out_dir / "sdcguard.prom")],
    ):
        code, _, err = as_user("--db", str(db), *args)
        assert code == 0, (args, err)
    assert snapshot(db) == before


@pytest.mark.parametrize("make", [_read_only_file, _read_only_dir], ids=["read-only file", "read-only directory"])
def test_writing_commands_name_the_store_read_only(place: Path, make: object) -> None:
    db = make(place)
    before = snapshot(db)
    for args in (["quarantine", "add", "sim:2", "--reason", "MCE"], ["prune", "--before", "30d"], ["policy"]):
        code, out, err = as_user("--db", str(db), *args)
        assert code == 2, (args, out, err)
        assert err.count("\n") == 1 and "internal error" not in err, err
        assert f"fleet store {db} is read-only" in err, err
    out_db = place / "rodir-out.db" if make is _read_only_file else db.parent / "new.db"
    code, _, err = as_user("merge", str(db), str(out_db) if out_db.exists() else str(_store(place / "in.db")))
    assert code == 2 and "is read-only" in err and err.count("\n") == 1, err
    assert snapshot(db) == before


def test_merge_reads_inputs_in_a_read_only_directory(place: Path) -> None:
    node = _read_only_dir(place)
    out_dir = place / "fleet"
    out_dir.mkdir()
    if ROOT_USER:
        os.chown(out_dir, NOBODY, NOBODY)
    before = snapshot(node)
    code, out, err = as_user("merge", str(out_dir / "fleet.db"), str(node))
    assert code == 0, err
    assert "+2 devices" in out
    assert snapshot(node) == before and sorted(p.name for p in node.parent.iterdir()) == ["fleet.db"]


def test_unmerged_wal_in_a_read_only_directory_is_one_clear_line(place: Path) -> None:
    d = place / "walstore"
    d.mkdir()
    db = _store(d / "fleet.db")
    # A writer that died with writes still in the -wal file (not checkpointed into the store file)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("INSERT INTO meta(key, value) VALUES ('x', 'y')")
    shutil.copy(db, place / "copy.db")
    shutil.copy(f"{db}-wal", place / "copy.db-wal")
    conn.close()
    os.replace(place / "copy.db", db)
    os.replace(place / "copy.db-wal", f"{db}-wal")
    Path(f"{db}-shm").unlink(missing_ok=True)
    d.chmod(0o555)
    code, out, err = as_user("--db", str(db), "report")
    if not ROOT_USER and code == 0:
        pytest.skip("this user can still read it")  # pragma: no cover
    assert code == 2 and err.count("\n") == 1, err
    assert "fleet.db-wal" in err and "read-only" in err, err


@pytest.mark.skipif(not ROOT_USER, reason="checks the test's own privilege drop, which only root can do")
def test_the_unprivileged_child_really_cannot_write(place: Path) -> None:
    db = _read_only_file(place)
    # without the store's own checks: SQLite itself refuses, proving the child's writes really are refused
    code, _, err = as_user("--db", str(db), "quarantine", "add", "sim:2", "--reason", "x")
    assert code == 2
    os.chmod(db, 0o644)
    os.chown(db, NOBODY, NOBODY)
    code, _, err = as_user("--db", str(db), "quarantine", "add", "sim:2", "--reason", "x")
    assert code == 0, err
