"""Every migration of both backends in one place (``sdcguard.fleet.store.schema.migrations``): a server store has
the same tables, columns, nullability and keys as SQLite's at the same version, every version past the server's base
has both steps, and an upgrade keeps a writer able to scan."""

from __future__ import annotations

import sqlite3

from sdcguard.fleet.store.schema.migrations import (
    BASE_VERSION,
    POSTGRES_MIGRATIONS,
    SCHEMA_VERSION,
    SQLITE_MIGRATIONS,
    migrate,
)
from sdcguard.fleet.store.store import Store
from sdcguard.testing.postgres import PostgresServer
from tests._fleet import result


def _sqlite_columns() -> dict[str, list[tuple[str, bool, bool]]]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("BEGIN")
    migrate(conn, 0)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    out = {
        t: [
            (name, bool(notnull) or bool(pk), bool(pk))
            for _, name, _, notnull, _, pk in conn.execute(f"PRAGMA table_info({t})")
        ]
        for t in tables
    }
    conn.close()
    return out


def test_both_backends_have_the_same_tables_columns_and_keys(pg_server: PostgresServer) -> None:
    url = pg_server.fresh_url()
    Store.open(url).close()
    schema = url.split("search_path%3D")[1]
    rows = pg_server.admin(
        "SELECT c.table_name, c.column_name, c.is_nullable = 'NO', EXISTS (SELECT 1 FROM "
        "information_schema.key_column_usage k JOIN information_schema.table_constraints tc ON "
        "tc.constraint_name = k.constraint_name AND tc.table_schema = k.table_schema WHERE tc.constraint_type = "
        "'PRIMARY KEY' AND k.table_schema = c.table_schema AND k.table_name = c.table_name AND k.column_name = "
        "c.column_name) FROM information_schema.columns c WHERE c.table_schema = %s ORDER BY c.table_name, "
        "c.ordinal_position",
        params=(schema,),
    )
    pg: dict[str, set[tuple[str, bool, bool]]] = {}
    for table, column, notnull, pk in rows:
        pg.setdefault(table, set()).add((column, notnull, pk))
    # (a column a PostgreSQL migration adds comes last: the store names every column it writes and reads)
    assert pg == {table: set(columns) for table, columns in _sqlite_columns().items()}


def test_every_version_past_the_base_has_both_migrations() -> None:
    assert set(POSTGRES_MIGRATIONS) == {v for v in SQLITE_MIGRATIONS if v > BASE_VERSION}
    assert max([BASE_VERSION, *POSTGRES_MIGRATIONS]) == SCHEMA_VERSION


def test_a_new_server_store_takes_every_migration_past_the_base(new_store) -> None:  # type: ignore[no-untyped-def]
    """(Version 11: a scrub's ``unverified`` outcome, its constraint replaced and its column added in place.)"""
    with Store.open(new_store("postgresql")) as s:
        s.training.record_scrub(checkpoint_id="ckpt", status="unverified", tensors=2, bytes=8, unverified=["opt.state"])
        (scrub,) = s.training.scrubs()
    assert (scrub.status, scrub.unverified) == ("unverified", ("opt.state",))


def test_an_upgrade_to_schema_12_keeps_a_writer_able_to_scan(pg_server: PostgresServer) -> None:
    """(Version 12: the family tallies are new tables; the roles granted on the day tallies get them too.)"""
    admin = pg_server.fresh_url()
    with Store.open(admin) as s:
        pg_server.admin("DROP ROLE IF EXISTS sdcguard_v11_scanner")
        pg_server.admin("CREATE ROLE sdcguard_v11_scanner LOGIN")
        s.maintenance.grant("sdcguard_v11_scanner")
    schema = admin.split("search_path%3D")[1]
    for table in ("family_tallies", "family_totals"):  # as a schema-11 store was
        pg_server.admin(f"DROP TABLE {schema}.{table}")
    pg_server.admin(f"UPDATE {schema}.meta SET value = '11' WHERE key = 'schema_version'")
    Store.open(admin).close()  # the owner's open migrates
    with Store.open(admin.replace("user=postgres", "user=sdcguard_v11_scanner")) as w:
        sid = w.scans.begin(device="sim:1", host="h", budget_s=5.0, started_at=20_000 * 86400.0)
        w.scans.record(sid, [result("sim:1", t=20_000 * 86400.0 + 1)], finish="complete")
        assert [(t.executions, t.failures) for t in w.counts.tallies(since=20_000 * 86400.0, by="device")] == [(1, 0)]
