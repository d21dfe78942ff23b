"""A PostgreSQL database made with a linguistic collation (what ``createdb`` gives on a server whose locale is
``en_US.UTF-8``, here ICU's ``en-US``) sorts text unlike Python and SQLite: ``"a1"`` after ``"a_2"``, ``"gpu-a"``
before ``"gpu-B"``. The store's figures must not depend on it: the slowness statistic's inputs over a window with a
partial first day, the whole report, the HTML page and the policy's decisions equal those of the same scans in a
SQLite store."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from sdcguard.fleet.report.devices import build_report, report_json
from sdcguard.fleet.slow import SlowSettings
from sdcguard.fleet.store.store import Store
from sdcguard.testing.postgres import PostgresServer
from tests._fleet import result, scan

DAY = 86400.0
START = 20_000 * DAY  # a UTC midnight
DEVICES = ("gpu-a", "gpu-B", "gpu-a_2", "gpu-a1")
CASES = ("a1", "a_2", "B.x", "b.x", "a-3")
"""Ids whose byte order and ICU en-US order differ, pair by pair."""
SETTINGS = SlowSettings(min_executions=1, min_cases=2, min_peers=2, confidence=0.75, spread_z=0.5)


def _fill(db: str) -> None:
    with Store.open(db) as s:
        for day in range(4):
            for k, device in enumerate(DEVICES):
                t = START + day * DAY + (3 + 5 * k) * 3600.0  # some scans before noon, some after
                results = [
                    result(device, case=c, family=c[0].lower(), t=t + i, duration_s=0.5 + 0.1 * k + 0.01 * i)
                    for i, c in enumerate(CASES)
                ]
                if day == 2 and k == 1:
                    results.append(result(device, case="a_2", family="a", passed=False, t=t + 9))
                scan(s, device, results, host=f"h{k % 2}", t=t)


@pytest.fixture
def icu_db(pg_server: PostgresServer) -> str:
    name = "icu_store"
    pg_server.admin(f"DROP DATABASE IF EXISTS {name}", "postgres")
    try:
        pg_server.admin(
            f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'",
            "postgres",
        )
    except Exception as e:  # a server built without ICU
        pytest.skip(f"this PostgreSQL server cannot make an ICU database: {e}")
    (order,) = pg_server.admin("SELECT 'a1' < 'a_2', 'gpu-a' < 'gpu-B'", name)
    assert order == (False, True), "the database must sort unlike Python, or this test tests nothing"
    return pg_server.url(name)


@pytest.mark.parametrize("since_hours", [12.0, 20.0, 33.5, None])
def test_figures_do_not_depend_on_the_servers_collation(icu_db: str, tmp_path: Path, since_hours: float | None) -> None:
    sqlite_db = str(tmp_path / "s.db")
    for db in (sqlite_db, icu_db):
        _fill(db)
    since = None if since_hours is None else START + DAY + since_hours * 3600.0
    got = {}
    for db in (sqlite_db, icu_db):
        with Store.open(db, readonly=True) as s:
            t = s.counts.case_times(since=since)
            assert len(t) == len({*zip(t.device, t.case)}), "one record per device and case"
            times = {(d, c): (n, round(x, 9)) for d, c, n, x in zip(t.device, t.case, t.executions, t.seconds)}
            report = report_json(build_report(s, since=since, families=True, slow=SETTINGS))
        got[db] = times, report
    assert got[icu_db] == got[sqlite_db]
    times, report = got[sqlite_db]
    assert {d for d, _ in times} == set(DEVICES) and '"slow_basis": "pair"' in report  # two devices per host: pairs


def test_the_page_and_the_policy_do_not_depend_on_the_servers_collation(icu_db: str, tmp_path: Path) -> None:
    from sdcguard.fleet.policy import QuarantinePolicy, apply_policy
    from sdcguard.fleet.report.html import build_html

    sqlite_db = str(tmp_path / "s.db")
    now = START + 4 * DAY
    got = {}
    for db in (sqlite_db, icu_db):
        _fill(db)
        with Store.open(db) as s:
            outcome = apply_policy(s, QuarantinePolicy(breaker_min_devices=5), now=now)
            page = build_html(s, since=START, window="all", now=now, slow=SETTINGS)
        # the page names the store it was built from; nothing else may differ
        got[db] = outcome.quarantined, outcome.reasons, page.replace(html.escape(db), "STORE")
    assert got[icu_db] == got[sqlite_db]
