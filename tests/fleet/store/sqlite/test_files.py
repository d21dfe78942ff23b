"""A SQLite store's file checked before SQLite touches it (``sdcguard.fleet.store.sqlite.files``): what is not a
store is refused and left untouched, and nothing is created where no store may be."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sdcguard.errors import SchemaTooNew, StoreError
from sdcguard.fleet.store.schema.migrations import SCHEMA_VERSION
from sdcguard.fleet.store.store import Store
from tests._fleet import snapshot


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
