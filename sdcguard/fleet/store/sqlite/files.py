"""A SQLite store's file, checked before SQLite touches it: the header read first, so a text file, a foreign SQLite
database or a store written by a newer sdcguard is refused with one sentence and left byte-for-byte untouched; whether
this process may write it; the URI that reads it without writing anything; the whole-file check; a merge input's
checks. Plain functions of a path (or a connection), shared by SQLite's backend (:mod:`.backend`) and by the
PostgreSQL store's copy of a merge input (:mod:`..postgres.transfer`)."""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path

from ....errors import SchemaTooNew, StoreError
from ..schema.migrations import SCHEMA_VERSION
from ..schema.tables import APPLICATION_ID, SQLITE_MAGIC

__all__ = [
    "check_header",
    "check_merge_input",
    "check_intact",
    "damaged",
    "read_only_uri",
    "writable_problem",
    "too_new",
    "CHECK_READS_UP_TO",
]

CHECK_READS_UP_TO = 256 << 20
"""A store opened only to be read is checked whole (``PRAGMA quick_check``, about 0.4 s for this many bytes on a
2-core machine) when it is at most this large; a larger one (a fleet store of thousands of devices, where the
report's goal is 2 s) is refused as damaged when a read meets the damage. A store opened for writing is always
checked whole first: nothing is ever written into a damaged store."""


def damaged(path: Path, detail: str) -> StoreError:
    """The one-line refusal of a store whose file is damaged past its header (a bad disk, a partial copy)."""
    return StoreError(
        f"fleet store {path} is damaged ({detail}) and was left as it is: recover its rows with "
        f"`sqlite3 {path} .recover | sqlite3 recovered.db`, or restore a backup"
    )


def check_intact(conn: sqlite3.Connection, path: Path) -> None:
    """Raise :func:`damaged` unless SQLite's ``quick_check`` finds every page of the store well formed (it only
    reads: the file is not changed)."""
    try:
        rows = conn.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e)):
            raise
        raise damaged(path, str(e)) from None
    if rows != [("ok",)]:
        raise damaged(path, " ".join(str(rows[0][0]).split()) if rows else "no answer from quick_check")


def check_header(path: Path) -> int:
    """Refuse what cannot be an sdcguard store before SQLite opens it; return the file's size (-1: missing)."""
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a fleet store file")
    parent = path.parent
    if not parent.is_dir():
        what = f"{parent} is not a directory" if parent.exists() else f"directory {parent} does not exist"
        raise StoreError(f"cannot open fleet store {path}: {what}")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return -1
    except PermissionError:
        raise StoreError(f"cannot read fleet store {path}: permission denied") from None
    except OSError as e:
        raise StoreError(f"cannot read fleet store {path}: {e.strerror or e}") from None
    if not header:
        return 0
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise StoreError(f"{path} is not an sdcguard fleet store (not a SQLite database); pass another --db")
    version = int.from_bytes(header[60:64], "big")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(too_new(path, version))
    return size


def too_new(path: Path, version: int) -> str:
    """The one-line refusal of a store written by a newer sdcguard."""
    return (
        f"{path} was written by a newer sdcguard (schema {version}; this one reads up to {SCHEMA_VERSION}): "
        "upgrade sdcguard to use it"
    )


def writable_problem(path: Path) -> str | None:
    """Why this process cannot write the store at ``path`` (None: it can). SQLite in WAL mode writes the file
    and creates ``-wal`` and ``-shm`` beside it, so the directory must be writable too."""
    parent = path.resolve().parent
    if path.exists() and not os.access(path, os.W_OK):
        return f"the file is read-only for this user ({_owner(path)})"
    if not os.access(parent, os.W_OK):
        return f"its directory {parent} is read-only for this user ({_owner(parent)})"
    return None


def _owner(path: Path) -> str:
    st = path.stat()
    try:
        import pwd

        owner = pwd.getpwuid(st.st_uid).pw_name
    except (KeyError, ImportError):
        owner = str(st.st_uid)
    return f"owner {owner}, mode {st.st_mode & 0o777:o}"


def read_only_uri(path: Path) -> str:
    """A SQLite URI that reads the store at ``path`` without writing anything, wherever it lies.

    ``mode=ro`` reads a WAL database when SQLite can open or create its ``-shm`` file (a writable directory, or
    one that exists). In a read-only directory without ``-shm``: when no ``-wal`` file holds writes, the database
    file has every committed row and ``immutable=1`` reads it (no locks, no ``-shm``); when one does,
    :class:`StoreError` says how to make it readable (``immutable`` would ignore those writes).
    """
    resolved = path.resolve()
    base = "file:" + urllib.parse.quote(str(resolved))
    shm, wal = Path(f"{resolved}-shm"), Path(f"{resolved}-wal")
    if os.access(resolved.parent, os.W_OK) or shm.exists():
        return base + "?mode=ro"
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(
            f"cannot read fleet store {path} in place: its directory is read-only and {wal.name} holds writes not "
            f"yet in the store file (SQLite needs {shm.name} to read them); let its owner open it once (e.g. "
            f"`sdcguard --db {path} report`), or copy {path.name} with {wal.name} to a writable directory"
        )
    return base + "?immutable=1"


def check_merge_input(path: Path) -> None:
    """Refuse a merge input that is missing, not a store, or of another schema version, without writing to it."""
    if not path.exists():
        raise StoreError(f"merge input {path} does not exist")
    if check_header(path) <= 0:
        raise StoreError(f"merge input {path} is empty, not a fleet store")
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app = conn.execute("PRAGMA application_id").fetchone()[0]
            if app == APPLICATION_ID:
                check_intact(conn, path)  # a merge reads every row of its inputs: a damaged one is refused whole
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"merge input {path} cannot be read as a fleet store: {e}") from None
    if app != APPLICATION_ID:
        raise StoreError(f"merge input {path} is a SQLite database but not an sdcguard fleet store")
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"merge input {path} was written by a newer sdcguard (schema {version}); upgrade sdcguard")
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"merge input {path} has the older schema {version}: open it once with this sdcguard "
            f"(`sdcguard --db {path} report`) to migrate it, then merge"
        )
