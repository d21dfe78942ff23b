"""``sdcguard report --html``: the page's content, its escaping, its bounds, and the CLI around it (no browser;
tests/fleet/report/test_report_html_browser.py loads it in Chromium)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.fleet.report.devices import build_report
from sdcguard.fleet.report.html import HtmlLimits, build_html, quarantine_segments, write_html
from sdcguard.fleet.report.svg import choose_bins
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo, Incident
from tests._fleet import NOW, clean, result, scan
from tests._html import HOSTILE, fill_store

DAY = 86400.0


def _page(store: Store, since: float | None = NOW - 7 * DAY, **kw: object) -> str:
    return build_html(store, since=since, window="7d" if since is not None else "all", now=NOW, **kw)


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "fleet.db") as s:
        yield s


def test_a_fresh_store_says_there_is_nothing_yet(store: Store) -> None:
    page = _page(store)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "No executions recorded in this window" in page
    assert '<svg class="chart"' not in page  # no axis drawn around nothing
    assert "No device has ever been quarantined" in page and "No training incident" in page
    assert re.search(r'class="card healthy"><b>0</b>', page)


def test_the_page_shows_status_hosts_series_quarantine_incidents_and_checkpoints(store: Store) -> None:
    fill_store(store)
    page = _page(store)
    for status, n in (("healthy", 3), ("suspect", 1), ("quarantined", 1), ("probation", 0)):
        assert f'class="card {status}"><b>{n}</b>' in page
    assert '<table class="sortable">' in page and "function sortBy" in page
    devices = re.search(r"<h2>Devices</h2>(.*?)</table>", page, re.S)
    assert devices is not None and all(f"<td>sim:{i}</td>" in devices.group(1) for i in range(1, 6))
    # the lemon host is ranked, marked, and the healthy host is not ranked at all
    hosts = re.search(r"<h2>Hosts: where the bad devices are</h2>(.*?)</table>", page, re.S)
    assert hosts is not None and "lemon?" in hosts.group(1) and "goodx" not in hosts.group(1)
    assert page.count('<svg class="spark"') == 2  # the quarantined and the suspect device
    assert '<svg class="chart"' in page and "per 5 min bin" in page  # three hours of data: minutes, not days
    assert "sticky failure x" in page and "quarantine timeline" in page
    assert "ckpt-100x" in page and "local grads differ x" in page and "4242" in page


def test_every_string_from_the_store_is_escaped(store: Store) -> None:
    fill_store(store, hostile=HOSTILE)
    odd = f"GPU-{HOSTILE}"  # a device id from another tool: recorded as it is, drawn everywhere a device is
    scan(store, odd, [*clean(odd, 5, t=NOW - 600), result(odd, passed=False, t=NOW - 590)], host="lemon", t=NOW - 600)
    store.quarantine.add(odd, reason="by hand", now=NOW - 300)
    page = _page(store)
    assert page.count("GPU-&lt;script&gt;") >= 5  # sparkline row, table, timeline label and tip, history
    assert "alert('x')" not in page and "<script>alert" not in page
    assert page.count("<script>") == 1 and page.count("</script>") == 1  # ours, at the end
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;&#x27;" in page
    for where in ("sticky failure ", "alice", "local grads differ ", "ckpt-100", "good"):
        assert f"{where}&lt;script&gt;" in page, where


def test_nothing_is_fetched_from_anywhere(store: Store) -> None:
    fill_store(store)
    page = _page(store)
    assert not re.search(r"https?://|\b(src|href)\s*=|url\(|@import", page, re.I)


def test_a_year_of_roll_ups_is_binned_by_week_and_every_execution_is_in_a_bin(tmp_path: Path) -> None:
    """Daily scans of 4 devices for a year, pruned to 30 days of rows (as deploy/ does): the all-time page has
    weekly bins whose executions add up to the report's, roll-ups included."""
    start = NOW - 365 * DAY
    with Store.open(tmp_path / "year.db") as store:
        for day in range(365):
            t = start + day * DAY
            for d in range(4):
                dev = f"sim:{d}"
                fail = [result(dev, passed=False, t=t + 9)] if d == 0 and day % 30 == 0 else []
                scan(store, dev, [*clean(dev, 3, t=t), *fail], host=f"node{d // 2}", t=t)
        store.quarantine.add("sim:0", reason="rate", now=start + 200 * DAY)
        store.quarantine.release("sim:0", reason="board replaced", now=start + 220 * DAY)
        store.maintenance.prune(before=NOW - 30 * DAY)
        page = _page(store, since=None)
        total = sum(r.overall.executions for r in build_report(store, since=None))
    assert "per 7 d bin" in page
    in_bins = sum(int(n.replace(",", "")) for n in re.findall(r"failed of ([\d,]+),", page))
    assert in_bins == total == 365 * 4 * 3 + 13
    assert "board replaced" in page and "probation" in page


def test_a_large_fleet_gives_a_bounded_page(store: Store) -> None:
    """10,000 devices, 60 of them failing on 20 hosts, 300 incidents: under 1 MB, the caps said on the page."""
    hosts = [f"host{n // 8:04d}" for n in range(10_000)]
    store.scans.record_devices(
        [DeviceInfo(id=f"sim:{n}", host=hosts[n], kind="sim") for n in range(10_000)], now=NOW - DAY
    )
    t = NOW - 3600
    for n in range(0, 160, 8):
        for k in range(3):
            dev = f"sim:{n + k}"
            # Each its own case: 60 devices failing the one case they all ran would be the suite's fault (the
            # breaker's rule), and the report no longer calls such devices suspect.
            wrong = result(dev, passed=False, case=f"alu.u32.c{n + k}", t=t + 20)
            scan(store, dev, [*clean(dev, 10, t=t), wrong], host=hosts[n + k], t=t)
        store.quarantine.add(f"sim:{n}", reason="sticky", now=t + 100)
    for i in range(300):
        store.training.record_incident(
            Incident(kind="replay", step=i, suspect_ranks=(0,), device="sim:0", detail="d" * 80, time=NOW - 3000 + i)
        )
    page = _page(store)
    assert len(page.encode()) < 1_000_000
    assert "9,000 healthy devices not listed" in page
    assert "100 older not shown" in page  # incidents beyond the 200 shown
    assert page.count('<svg class="spark"') == HtmlLimits().sparklines


@given(st.floats(0, 2e9), st.floats(0, 400 * DAY))
def test_bins_cover_the_window_in_at_most_120_aligned_bins(start: float, span: float) -> None:
    b = choose_bins(start, start + span)
    assert b.origin <= start and b.origin + b.count * b.width >= start + span
    assert b.origin % b.width == 0 and 1 <= b.count <= 121


def test_bins_follow_the_window_and_whole_days_before_the_horizon() -> None:
    assert choose_bins(NOW - 7 * DAY, NOW).label == "3 h"
    assert choose_bins(NOW - 3600, NOW).label == "1 min"
    assert choose_bins(NOW - 365 * DAY, NOW).label == "7 d"
    assert choose_bins(NOW - 2 * DAY, NOW, whole_days_before=NOW - DAY).label == "1 d"  # roll-ups inside


def test_quarantine_segments_follow_the_history() -> None:
    h = [
        {"device": "a", "action": "quarantine", "time": 10.0, "reason": "r1"},
        {"device": "a", "action": "release", "time": 20.0, "reason": "r2"},
        {"device": "a", "action": "probation_passed", "time": 30.0, "reason": "r3"},
        {"device": "b", "action": "quarantine", "time": 25.0, "reason": "r4"},
    ]
    segs = quarantine_segments(h)
    assert [(s.state, s.start, s.end) for s in segs["a"]] == [("quarantined", 10.0, 20.0), ("probation", 20.0, 30.0)]
    assert [(s.state, s.end) for s in segs["b"]] == [("quarantined", None)]


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_cli_writes_the_page_atomically(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Store.open(db) as s:
        fill_store(s)
    out = tmp_path / "www" / "index.html"
    out.parent.mkdir()
    out.write_text("old page")
    code, stdout, err = _cli("--db", str(db), "report", "--html", str(out), "--format", "json")
    assert code == 0, err
    assert stdout.startswith("[") and f"page written to {out}" in err
    assert "sdcguard fleet report" in out.read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["index.html"]  # no temporary file left behind
    assert out.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("where", ["missing/page.html", "."])
def test_cli_bad_html_path_is_one_line_and_exit_2(tmp_path: Path, where: str) -> None:
    db = tmp_path / "fleet.db"
    Store.open(db).close()
    code, _, err = _cli("--db", str(db), "report", "--html", str(tmp_path / where))
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "does not exist" in err if where.startswith("missing") else "is a directory" in err


def test_write_html_returns_the_size(store: Store, tmp_path: Path) -> None:
    fill_store(store)
    path = tmp_path / "r.html"
    assert write_html(store, path, since=None, window="all", now=NOW) == path.stat().st_size
