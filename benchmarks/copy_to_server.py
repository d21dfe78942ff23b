"""Copy a SQLite fleet store, table by table, into a new store on a PostgreSQL server: how the 100,000-device server
store of docs/postgresql.md was loaded, where merging 12,500 node stores one by one would take hours.

The server's tables are SQLite's by construction (:mod:`sdcguard.fleet.store.postgres.schema`), so every row goes as
it is (``COPY``), the running totals and kept summaries with the rows they sum; the identity sequences then start
past the copied ids, the foreign keys are not checked again (the rows are a consistent store), and ``VACUUM
(ANALYZE)`` runs at the end. A benchmark's tool, not a migration: the server store gets the file's store id, so the
two are one store twice (never merge one into the other). Needs a superuser (``session_replication_role``).

    python benchmarks/report_scale.py --devices 100000 --days 2 --merge-days 1 --dir /dev/shm/f100k
    python benchmarks/copy_to_server.py /dev/shm/f100k/fleet.db 'postgresql://...?options=-csearch_path%3Df100k'
    python benchmarks/report_scale.py --measure 'postgresql://...?options=-csearch_path%3Df100k'
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from sdcguard.fleet.store.schema.migrations import SCHEMA_VERSION  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402

_SERVER_META = ("schema_version", "application", "created_by")
"""``meta`` keys the server store keeps its own of."""


def copy_store(source: Path, url: str) -> None:
    """Every row of the SQLite store ``source`` into the empty server store at ``url`` (created here)."""
    with closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as lite:
        version = lite.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise SystemExit(f"{source} has schema {version}; open it once with this sdcguard first")
        Store.open(url).close()  # the tables, at this code's schema
        tables = [
            n
            for (n,) in lite.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        lite.execute("BEGIN")  # one snapshot of the file for every table
        with psycopg.connect(url) as pg:
            if pg.execute("SELECT COUNT(*) FROM devices").fetchone()[0]:
                raise SystemExit(f"{url} holds a store already: copy into an empty schema")
            pg.execute("SET session_replication_role = replica")
            pg.execute("DELETE FROM meta WHERE key = 'store_id'")
            for table in tables:
                columns = [r[1] for r in lite.execute(f"PRAGMA table_info({table})")]
                where = f" WHERE key NOT IN {_SERVER_META}" if table == "meta" else ""
                t, n = time.perf_counter(), 0
                with pg.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in lite.execute(f"SELECT {', '.join(columns)} FROM {table}{where}"):
                        copy.write_row(row)
                        n += 1
                if "id" in columns and table != "devices":
                    pg.execute(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
                    )
                print(f"{table}: {n:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
            pg.commit()
    with Store.open(url) as store:
        t = time.perf_counter()
        store.maintenance.vacuum()
        print(f"VACUUM (ANALYZE): {time.perf_counter() - t:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", type=Path, help="the SQLite fleet store")
    ap.add_argument("url", help="a postgresql:// URL of an empty schema")
    args = ap.parse_args()
    copy_store(args.source, args.url)


if __name__ == "__main__":
    main()
