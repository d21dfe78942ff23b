"""``sdcguard plan`` on stores a test wrote: the interval is Young's and Daly's formula at the allocation's rate
(its devices' failures per test-hour, summed), shorter with more failures and with a lemon in the allocation, and
unmoved by evidence from before a release; bad input is one line, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.fleet.plan.advice import PlanSettings, make_plan
from sdcguard.fleet.plan.allocation import read_allocation
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, result, scan

DEVICES = [f"cpu:n{i // 2}:{i % 2}" for i in range(4)]
SINCE = NOW - 30 * 86400.0
C, STEP = 40.0, 1.0
property_settings = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _store(path: Path | str, failures: list[int], *, passes: int = 20, duration_s: float = 30.0) -> None:
    """Each device: ``passes`` passing executions and its failures, every execution ``duration_s`` long."""
    with Store.open(path) as store:
        for d, k in zip(DEVICES, failures, strict=True):
            rows = [result(d, t=NOW - 7200 + i, duration_s=duration_s) for i in range(passes)]
            rows += [result(d, passed=False, t=NOW - 3600 + i, duration_s=duration_s) for i in range(k)]
            scan(store, d, rows, host=d.split(":")[1], t=NOW - 7200)


def _plan(path: Path, mtbf_s: float | None = None):  # type: ignore[no-untyped-def]
    with Store.open(path, readonly=True) as store:
        allocation = read_allocation(store, DEVICES, since=SINCE)
    return allocation, make_plan(allocation, PlanSettings(step_s=STEP, checkpoint_s=C, mtbf_s=mtbf_s))


@property_settings
@given(st.lists(st.integers(0, 6), min_size=4, max_size=4).filter(any))
def test_the_interval_is_young_and_daly_at_the_allocations_rate(
    tmp_path_factory: pytest.TempPathFactory, failures: list[int]
) -> None:
    path = tmp_path_factory.mktemp("plan") / "f.db"
    _store(path, failures)
    allocation, plan = _plan(path)
    hours = [(20 + k) * 30.0 / 3600 for k in failures]
    per_hour = sum(k / h for k, h in zip(failures, hours))
    assert allocation.per_hour == pytest.approx(per_hour, rel=1e-9)
    m = 3600.0 / per_hour
    assert plan.young_s == pytest.approx(math.sqrt(2 * C * m), rel=1e-9)
    r = C / (2 * m)
    daly = m if C >= 2 * m else math.sqrt(2 * C * m) * (1 + math.sqrt(r) / 3 + r / 9) - C
    assert plan.daly_s == pytest.approx(daly, rel=1e-9)


@property_settings
@given(st.lists(st.integers(0, 5), min_size=4, max_size=4), st.integers(0, 3), st.integers(1, 4))
def test_more_failures_never_lengthen_the_interval(
    tmp_path_factory: pytest.TempPathFactory, failures: list[int], device: int, more: int
) -> None:
    d = tmp_path_factory.mktemp("plan")
    worse = list(failures)
    worse[device] += more
    _store(d / "a.db", failures)
    _store(d / "b.db", worse)
    (_, a), (_, b) = _plan(d / "a.db", mtbf_s=86400.0), _plan(d / "b.db", mtbf_s=86400.0)
    assert b.sdc_per_day > a.sdc_per_day and b.young_s < a.young_s and b.daly_s <= a.daly_s


def test_a_lemon_is_named_and_shortens_the_interval(tmp_path: Path) -> None:
    _store(tmp_path / "even.db", [1, 1, 1, 1], passes=200)
    _store(tmp_path / "lemon.db", [0, 0, 0, 40], passes=200)
    even, with_lemon = _plan(tmp_path / "even.db"), _plan(tmp_path / "lemon.db")
    assert with_lemon[1].daly_s < even[1].daly_s
    assert [d.device for d in with_lemon[0].lemons()] == [DEVICES[3]] and even[0].lemons() == []


def test_evidence_from_before_a_release_changes_nothing(tmp_path: Path) -> None:
    _store(tmp_path / "clean.db", [0, 0, 0, 0])
    _store(tmp_path / "released.db", [0, 0, 0, 0])
    with Store.open(tmp_path / "released.db") as store:  # a failing scan, then the device released by hand
        scan(store, DEVICES[1], [result(DEVICES[1], passed=False, t=NOW - 86400)], host="n0", t=NOW - 86400)
        store.quarantine.add(DEVICES[1], reason="failing", now=NOW - 80000)
        store.quarantine.release(DEVICES[1], reason="board replaced", now=NOW - 70000)
    clean, released = _plan(tmp_path / "clean.db", 86400.0), _plan(tmp_path / "released.db", 86400.0)
    assert released[0].per_hour == clean[0].per_hour == 0.0
    assert released[1].daly_s == clean[1].daly_s


def _cli(db: Path | str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["--db", str(db), "plan", *args])
    return r.exit_code, r.output


def test_the_command_prints_a_plan_json_and_a_line_a_launcher_sources(store_db: str) -> None:
    """On SQLite and on the PostgreSQL server the tests start."""
    db = store_db
    _store(db, [0, 0, 0, 8])
    base = ["--hosts", "n0,n1", "--step-time", "1s", "--checkpoint-cost", "40s", "--mtbf", "12h"]
    code, out = _cli(db, *base, "--format", "env")
    assert code == 0 and out.startswith("SDCGUARD_REPLAY_EVERY=50 SDCGUARD_CHECKSUM_EVERY="), out
    code, out = _cli(db, *base, "--format", "json")
    body = json.loads(out)
    assert code == 0 and body["devices"] == 4 and [d["device"] for d in body["lemons"]] == [DEVICES[3]]
    code, out = _cli(db, *base)
    assert code == 0 and "checkpoint interval, Daly" in out and DEVICES[3] in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--devices", "{tmp}/ids", "--step-time", "1s", "--checkpoint-cost", "40s"], "not a device id"),
        (["--devices", "{tmp}/none", "--step-time", "1s", "--checkpoint-cost", "40s"], "cannot read it"),
        (["--devices", "{tmp}/empty", "--step-time", "1s", "--checkpoint-cost", "40s"], "the allocation is empty"),
        (["--hosts", "n0", "--step-time", "0", "--checkpoint-cost", "40s"], "must be > 0"),
        (["--hosts", "n0", "--step-time", "1s", "--checkpoint-cost", "-4"], "is not a duration"),
        (["--hosts", "n7", "--step-time", "1s", "--checkpoint-cost", "40s"], "knows no device on n7"),
        (["--step-time", "1s", "--checkpoint-cost", "40s"], "give the allocation once"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    db = tmp_path / "f.db"
    _store(db, [0, 0, 0, 0])
    (tmp_path / "ids").write_text("cpu:n0:0\nnot an id\n")
    (tmp_path / "empty").write_text("# nothing\n")
    code, out = _cli(db, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and words in out and len(out.strip().splitlines()) == 1, out
