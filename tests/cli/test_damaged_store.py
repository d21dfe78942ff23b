"""A store damaged past its header (a bad disk, a copy cut short and patched) is refused by every command in one
line that names the file and says how to recover it, and nothing is written into it: before, most commands failed
with ``internal error: DatabaseError``, ``incidents`` and ``quarantine list`` exited 0, ``prune`` wrote into it and
``merge --full`` read it as "+0"."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.errors import StoreError
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, clean, result, scan

PAGE = 4096


def _damage(path: Path) -> None:
    """Overwrite the first page of the results table, in the middle of the file, with bytes no b-tree page holds."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'results'").fetchone()[0]
    finally:
        conn.close()
    assert 1 < root < pages, (root, pages)
    with open(path, "r+b") as f:
        f.seek((root - 1) * PAGE)
        f.write(bytes([0x5A]) * PAGE)


@pytest.fixture()
def damaged_db(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    with Store.open(path) as store:
        for n in range(12):
            dev = f"sim:{n}"
            cases = [result(dev, case=f"gemm.fp32.c{i}", t=NOW - 3600 + i) for i in range(60)]
            scan(store, dev, [*cases, result(dev, passed=False, case="alu.u32.chain")])
        store.training.record_incident(
            Incident(kind="replay", step=3, suspect_ranks=(1,), device="sim:1", time=NOW, detail="grads differ")
        )
        store.quarantine.add("sim:2", reason="MCE", by="ops")
    _damage(path)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


COMMANDS = [
    ["report"],
    ["report", "--format", "json", "--since", "all"],
    ["incidents"],
    ["checkpoints"],
    ["quarantine", "list"],
    ["quarantine", "history"],
    ["quarantine", "decisions"],
    ["quarantine", "add", "sim:3", "--reason", "x"],
    ["quarantine", "release", "sim:2", "--reason", "x"],
    ["policy"],
    ["prune", "--before", "7d"],
    ["export", "prometheus", "{tmp}/out.prom"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_every_command_refuses_a_damaged_store_in_one_line_and_writes_nothing(
    damaged_db: Path, args: list[str], tmp_path: Path
) -> None:
    before = _digest(damaged_db)
    argv = ["--db", str(damaged_db), *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    r = CliRunner().invoke(cli, argv)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(damaged_db) in lines[0] and "damaged" in lines[0] and ".recover" in lines[0], lines[0]
    assert "internal error" not in lines[0]
    assert _digest(damaged_db) == before
    assert not Path(f"{damaged_db}-wal").exists() or Path(f"{damaged_db}-wal").stat().st_size == 0


@pytest.mark.parametrize("full", [False, True])
def test_merge_refuses_a_damaged_input_and_a_damaged_output(damaged_db: Path, tmp_path: Path, full: bool) -> None:
    good = tmp_path / "good.db"
    with Store.open(good) as store:
        scan(store, "sim:99", clean("sim:99", 5))
    extra = ["--full"] if full else []
    before = _digest(damaged_db)
    into_good = CliRunner().invoke(cli, ["merge", *extra, str(good), str(damaged_db)])
    assert into_good.exit_code == 2 and "damaged" in into_good.stderr and str(damaged_db) in into_good.stderr
    into_damaged = CliRunner().invoke(cli, ["merge", *extra, str(damaged_db), str(good)])
    assert into_damaged.exit_code == 2 and "damaged" in into_damaged.stderr, into_damaged.output
    assert _digest(damaged_db) == before


def test_the_scanner_refuses_a_damaged_store_before_scanning(damaged_db: Path) -> None:
    before = _digest(damaged_db)
    r = CliRunner().invoke(cli, ["--db", str(damaged_db), "scan", "--device", "cpu:0", "--all", "--budget", "1"])
    assert r.exit_code == 2 and "damaged" in r.stderr and ".recover" in r.stderr, r.output
    assert _digest(damaged_db) == before


def test_the_library_refuses_it_for_writing_and_a_large_one_for_reading_when_a_read_meets_the_damage(
    damaged_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(StoreError, match="damaged"):
        Store.open(damaged_db)
    # Up to CHECK_READS_UP_TO bytes (the file's, not its header's) a reading open checks the whole file first.
    size = os.path.getsize(damaged_db)
    monkeypatch.setattr("sdcguard.fleet.store.sqlite.files.CHECK_READS_UP_TO", size)
    with pytest.raises(StoreError, match="damaged"):
        Store.open(damaged_db, readonly=True).close()
    # Past it a reading open skips the whole-file check; the damaged page still refuses the read.
    monkeypatch.setattr("sdcguard.fleet.store.sqlite.files.CHECK_READS_UP_TO", size - 1)
    with Store.open(damaged_db, readonly=True) as store:  # opened unchecked
        with pytest.raises(StoreError, match="damaged"):
            store.failures.executions(since=0.0)  # reads the rows of the damaged table
    assert os.path.getsize(damaged_db) > 0
