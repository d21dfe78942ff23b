"""The store's one SQL text as PostgreSQL reads it (``sdcguard.fleet.store.postgres.dialect``): each rewriting rule,
and what has no spelling there says so."""

from __future__ import annotations

import pytest

from sdcguard.fleet.store.postgres.dialect import to_postgres


@pytest.mark.parametrize(
    ("sqlite", "postgres"),
    [
        ("SELECT a FROM t WHERE b = ? AND c = :c", "SELECT a FROM t WHERE b = %s AND c = %(c)s"),
        ("INSERT OR IGNORE INTO t(a) VALUES (?)", "INSERT INTO t(a) VALUES (%s) ON CONFLICT DO NOTHING"),
        (
            "UPDATE t SET a = MIN(a, ?), b = MAX(b, MAX(c, d)) WHERE e = MAX(f)",
            "UPDATE t SET a = LEAST(a, %s), b = GREATEST(b, GREATEST(c, d)) WHERE e = MAX(f)",
        ),
        ("SELECT CAST(t / 86400.0 AS INTEGER)", "SELECT CAST(trunc(CAST(t / 86400.0 AS DOUBLE PRECISION)) AS BIGINT)"),
        (
            "SELECT 1 FROM results INDEXED BY results_time CROSS JOIN s ON s.a = 1",
            "SELECT 1 FROM results  JOIN s ON s.a = 1",
        ),
        (
            "CREATE TEMP TABLE x(a INTEGER, b REAL, PRIMARY KEY (a)) WITHOUT ROWID",
            "CREATE TEMP TABLE x(a BIGINT, b DOUBLE PRECISION, PRIMARY KEY (a)) ",
        ),
        ("SELECT 1 FROM main.t JOIN temp.u JOIN src.v", "SELECT 1 FROM t JOIN pg_temp.u JOIN pg_temp.src_v"),
        ("SELECT value FROM json_each(?) WHERE x = 'a?%'", "SELECT value FROM sdcguard_json_each(%s) WHERE x = 'a?%%'"),
    ],
)
def test_each_rule_of_the_dialect(sqlite: str, postgres: str) -> None:
    assert to_postgres(sqlite) == postgres


def test_insert_or_replace_has_no_spelling_and_says_so() -> None:
    with pytest.raises(ValueError, match="ON CONFLICT"):
        to_postgres("INSERT OR REPLACE INTO t(a) VALUES (1)")
