"""Slowness verdicts kept in the store: what a report at fleet scale reads instead of every (device, case) pair.

The rule it must keep: a kept verdict is used only for a window of the same length, the same settings, and no
older than the reader's ``max_age_s``; read back, it is the verdict that was computed (to the bit), stamped with
when; training incidents still apply live; anything else computes afresh.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.durations import DAY_S, iso_utc
from sdcguard.fleet.policy import apply_policy
from sdcguard.fleet.report.devices import build_report
from sdcguard.fleet.slow import Slowness, SlowSettings
from sdcguard.fleet.slow_fleet import fleet_slowness
from sdcguard.fleet.store.store import Store
from sdcguard.records import CaseResult, DeviceInfo, Incident
from tests._fleet import NOW

CASES = [(f"c{i}", ("gemm", "alu", "ieee")[i % 3], 0.001 * (1 + i)) for i in range(12)]
SPEEDS = {"cpu:a:0": 1.0, "cpu:a:1": 1.0, "cpu:a:2": 1.0, "cpu:a:3": 1.0, "cpu:a:4": 3.0, "cpu:b:0": 1.0}
"""Five devices of one model (one of them three times as slow) and one of another model, alone."""


def _scan(store: Store, device: str, speed: float, t: float) -> None:
    host = device.split(":")[1]
    model = "Xeon" if host == "a" else "Epyc"
    store.scans.record_devices([DeviceInfo(id=device, host=host, kind="cpu", model=model)], now=t)
    sid = store.scans.begin(device=device, host=host, budget_s=60.0, started_at=t)
    rows = [
        CaseResult(device=device, case=c, family=f, seed=1, passed=True, duration_s=base * speed, started_at=t + k)
        for c, f, base in CASES
        for k in range(5)
    ]
    store.scans.record(sid, rows, finish="complete", finished_at=t + 60)


def _fill(store: Store, t: float) -> None:
    for d, speed in SPEEDS.items():
        _scan(store, d, speed, t)


def _text_column(value: str, **change: object) -> str:
    """A kept summary with its ``reason`` column changed."""
    kept = json.loads(value)
    kept["columns"]["reason"].update(change)
    return json.dumps(kept)


def _unstamped(verdicts: dict[str, Slowness]) -> dict[str, Slowness]:
    return {d: dataclasses.replace(v, judged_at=None) for d, v in verdicts.items()}


def test_kept_verdicts_read_back_as_computed_on_both_backends(store_db: str) -> None:
    with Store.open(store_db) as store:
        _fill(store, NOW - 3600)
        computed = fleet_slowness(store, since=NOW - DAY_S, now=NOW, keep=True)
        assert computed["cpu:a:4"].slow and computed["cpu:b:0"].basis == "none"  # a verdict of each kind kept
        assert all(v.judged_at is None for v in computed.values())
        kept = fleet_slowness(store, since=NOW + 30 - DAY_S, now=NOW + 30, max_age_s=60)
        assert _unstamped(kept) == computed
        assert {v.judged_at for v in kept.values()} == {NOW}
        assert kept["cpu:a:4"].as_dict()["slow_judged_at"] == iso_utc(NOW)


def test_a_kept_summary_is_used_only_for_its_window_length_settings_and_age(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, NOW - 3600)
        fleet_slowness(store, since=NOW - DAY_S, now=NOW, keep=True)
        _scan(store, "cpu:a:0", 6.0, NOW - 1800)  # after the verdicts were kept, cpu:a:0 turns slow

        def judged(*, now: float, window: float = DAY_S, age: float = 600, s: SlowSettings | None = None) -> bool:
            v = fleet_slowness(store, since=now - window, now=now, max_age_s=age, settings=s)["cpu:a:0"]
            assert v.slow is (v.judged_at is None)  # a kept verdict predates the slow scan; a fresh one sees it
            return v.judged_at is not None

        assert judged(now=NOW + 300)  # the same window length, 5 minutes old
        assert judged(now=NOW + 600)  # as old as allowed
        assert not judged(now=NOW + 601)  # older
        assert not judged(now=NOW + 300, age=0)  # 0: always computed
        assert not judged(now=NOW - 1)  # a reader whose window ends before the verdicts were computed
        assert not judged(now=NOW + 300, window=2 * DAY_S)  # another window
        assert not judged(now=NOW + 300, s=SlowSettings(threshold=0.5))  # other settings
        assert fleet_slowness(store, since=None, now=NOW, max_age_s=600)["cpu:a:0"].judged_at is None  # all time


def test_each_window_length_keeps_its_own_summary(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, NOW - 3600)
        for window in (DAY_S, 7 * DAY_S, None):
            fleet_slowness(store, since=None if window is None else NOW - window, now=NOW, keep=True)
        for window in (DAY_S, 7 * DAY_S, None):
            since = None if window is None else NOW + 10 - window
            v = fleet_slowness(store, since=since, now=NOW + 10, max_age_s=60)
            assert {x.judged_at for x in v.values()} == {NOW}, window


def test_a_training_incident_after_the_verdicts_were_kept_still_marks_its_device(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, NOW - 3600)
        fleet_slowness(store, since=NOW - DAY_S, now=NOW, keep=True)
        store.training.record_incident(
            Incident(
                kind="slow",
                step=3,
                suspect_ranks=(1,),
                device="cpu:a:1",
                devices=("cpu:a:1",),
                hosts=("a",),
                detail="rank 1 took 1.5x its peer's time",
                job="j",
                time=NOW - 60,
                job_size=2,
            )
        )
        v = fleet_slowness(store, since=NOW + 5 - DAY_S, now=NOW + 5, max_age_s=60)
        assert v["cpu:a:1"].slow and v["cpu:a:1"].basis == "training" and v["cpu:a:4"].judged_at == NOW


def test_the_fleet_policy_keeps_its_windows_verdicts_for_the_report(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, NOW - 3600)
        assert apply_policy(store, now=NOW).slow == ["cpu:a:4"]
        rows = {r.device: r.as_dict() for r in build_report(store, since=NOW + 60 - 7 * DAY_S, now=NOW + 60)}
        assert rows["cpu:a:4"]["slow"] and rows["cpu:a:4"]["slow_judged_at"] is None  # default: computed
        rows = {
            r.device: r.as_dict()
            for r in build_report(store, since=NOW + 60 - 7 * DAY_S, now=NOW + 60, slow_max_age_s=3600)
        }
        assert rows["cpu:a:4"]["slow"] and rows["cpu:a:4"]["slow_judged_at"] == iso_utc(NOW)
        assert {r["slow_judged_at"] for r in rows.values()} == {iso_utc(NOW)}


def test_db_refresh_keeps_the_report_windows_and_the_cli_report_reads_them(tmp_path: Path) -> None:
    db = str(tmp_path / "f.db")
    with Store.open(db) as store:
        _fill(store, time.time() - 3600)
    run = CliRunner().invoke
    r = run(cli, ["--db", db, "db", "refresh"])
    assert r.exit_code == 0, r.output
    assert "6 devices over 7d (1 slow)" in r.output and "over 30d" in r.output
    for window in ("7d", "30d"):
        out = run(cli, ["--db", db, "report", "--since", window, "--format", "json"])
        assert out.exit_code == 0, out.output
        rows = {x["device"]: x for x in json.loads(out.output)}
        assert rows["cpu:a:4"]["slow"] and rows["cpu:a:4"]["slow_judged_at"] is not None, window
    live = json.loads(run(cli, ["--db", db, "report", "--slow-max-age", "0", "--format", "json"]).output)
    assert {x["slow_judged_at"] for x in live} == {None} and [x["device"] for x in live if x["slow"]] == ["cpu:a:4"]
    other = json.loads(run(cli, ["--db", db, "report", "--since", "2d", "--format", "json"]).output)
    assert {x["slow_judged_at"] for x in other} == {None}  # no verdicts kept for 2 days: computed
    prom = tmp_path / "sdcguard.prom"
    out = run(cli, ["--db", db, "export", "prometheus", str(prom), "--slow-max-age", "30m"])
    assert out.exit_code == 0 and 'sdcguard_device_slow{gpu="4",UUID="cpu:a:4"' in prom.read_text(), out.output


@pytest.mark.parametrize(
    "argv, words",
    [
        (["report", "--slow-max-age", "soon"], "--slow-max-age 'soon' is not a duration"),
        (["report", "--slow-max-age", "-1h"], "--slow-max-age '-1h' is not a duration"),
        (["db", "refresh", "--window", "a week"], "'a week' is not a duration"),
    ],
)
def test_a_bad_age_or_window_is_one_line_exit_2(tmp_path: Path, argv: list[str], words: str) -> None:
    db = str(tmp_path / "f.db")
    with Store.open(db) as store:
        _fill(store, time.time() - 3600)
    r = CliRunner().invoke(cli, ["--db", db, *argv])
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize(
    "damage",
    [
        lambda v: v[: len(v) // 2],  # cut short: not JSON
        lambda v: v.replace('"f8":"', '"f8":"@@', 1),  # not base64
        lambda v: json.dumps({**json.loads(v), "columns": {"device": ["cpu:a:0"]}}),  # a column missing
        lambda v: json.dumps({**json.loads(v), "at": "noon"}),  # a time that is not one
        lambda v: "[1, 2]",  # JSON, but no summary
        lambda v: _text_column(v, values=["peers"]),  # an index past the distinct values
        lambda v: _text_column(v, values="peers"),  # values that are not a list
        lambda v: _text_column(v, u4=base64.b64encode(bytes(4)).decode()),  # one index for six devices
    ],
)
def test_a_damaged_summary_is_ignored_with_a_warning_and_the_verdicts_computed(
    tmp_path: Path, damage: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "f.db"
    with Store.open(db) as store:
        _fill(store, NOW - 3600)
        computed = fleet_slowness(store, since=NOW - DAY_S, now=NOW, keep=True)
    with closing(sqlite3.connect(db)) as c, c:
        (value,) = c.execute("SELECT value FROM meta WHERE key = 'summary.slowness.86400'").fetchone()
        c.execute("UPDATE meta SET value = ? WHERE key = 'summary.slowness.86400'", (damage(value),))
    with Store.open(db, readonly=True) as store, caplog.at_level(logging.WARNING, logger="sdcguard.fleet"):
        again = fleet_slowness(store, since=NOW + 5 - DAY_S, now=NOW + 5, max_age_s=60)
    assert again == computed and {v.judged_at for v in again.values()} == {None}
    assert "kept summary slowness.86400" in caplog.text and "computing the verdicts" in caplog.text
