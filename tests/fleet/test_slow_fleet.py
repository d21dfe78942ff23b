"""Slow devices on the fleet side: the statistic (properties), the store's timings, the report, the policy."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy
from sdcguard.fleet.report.devices import build_report, report_csv_rows
from sdcguard.fleet.report.html import build_html
from sdcguard.fleet.report.prometheus import render_textfile
from sdcguard.fleet.slow import SlowSettings, judge_slow
from sdcguard.fleet.slow_fleet import fleet_slowness
from sdcguard.fleet.store.rows import CaseTimes, CaseTiming
from sdcguard.fleet.store.store import Store
from sdcguard.medians import median_lower_bound
from sdcguard.records import CaseResult, DeviceInfo, Incident
from tests._fleet import NOW
from tests._slow_reference import reference_judge_slow

CASES = [(f"c{i}", ("gemm", "alu", "ieee")[i % 3], 0.001 * (1 + i)) for i in range(12)]
"""(case, family, base seconds per execution)."""


def timings(
    speeds: dict[str, float], *, executions: int = 10, scan: int = 1, jitter: Sequence[float] | None = None
) -> list[CaseTiming]:
    """Every device runs every case ``executions`` times, ``speeds[d]`` times slower than the base (times a
    per-case jitter)."""
    out = []
    for n, d in enumerate(sorted(speeds)):
        for i, (case, family, base) in enumerate(CASES):
            j = 1.0 if jitter is None else jitter[(i + 7 * n) % len(jitter)]
            out.append(
                CaseTiming(
                    device=d,
                    case=case,
                    family=family,
                    scan=scan + n,
                    executions=executions,
                    seconds=executions * base * speeds[d] * j,
                )
            )
    return out


def one_model(devices: Sequence[str]) -> dict[str, str]:
    return {d: "cpu|Xeon" for d in devices}


# --------------------------------------------------------------------------------------------- the statistic


def test_a_core_twice_as_slow_as_its_one_peer_is_slow_with_medium_confidence() -> None:
    v = judge_slow(timings({"a": 1.0, "b": 2.0}), one_model("ab"))
    assert v["b"].slow and v["b"].basis == "pair" and v["b"].confidence == "medium"
    assert v["b"].slowdown == pytest.approx(2.0) and set(v["b"].families) == {"gemm", "alu", "ieee"}
    assert not v["a"].slow and v["a"].slowdown == pytest.approx(0.5)


def test_many_peers_give_a_high_confidence_verdict_and_the_spread_protects_a_noisy_model() -> None:
    speeds = {f"d{i}": 1.0 for i in range(8)} | {"slow": 1.5}
    v = judge_slow(timings(speeds), one_model(speeds))
    assert v["slow"].slow and v["slow"].basis == "peers" and v["slow"].confidence == "high"
    assert [d for d, x in v.items() if x.slow] == ["slow"]
    # devices of a model that naturally vary by +-40%: 1.5x is within their spread, nobody is flagged
    noisy = {f"d{i}": s for i, s in enumerate((0.6, 0.8, 1.0, 1.2, 1.4, 0.7, 1.3, 1.5))}
    v = judge_slow(timings(noisy), one_model(noisy))
    assert not any(x.slow for x in v.values())


def test_too_few_cases_or_executions_decide_nothing() -> None:
    few = [t for t in timings({"a": 1.0, "b": 3.0}) if t.case in ("c0", "c1", "c2")]
    assert not any(x.slow for x in judge_slow(few, one_model("ab")).values())
    thin = timings({"a": 1.0, "b": 3.0}, executions=2)
    assert not any(x.slow for x in judge_slow(thin, one_model("ab")).values())


def test_peers_are_devices_of_the_same_model_only() -> None:
    v = judge_slow(timings({"a": 1.0, "b": 2.0}), {"a": "cpu|old", "b": "cpu|new"})
    assert not v["a"].slow and not v["b"].slow and v["b"].peers == 0


def test_own_history_confirms_a_pair_verdict_and_alone_gives_a_low_confidence_one() -> None:
    before = timings({"a": 1.0, "b": 1.0}, scan=1)
    after = timings({"a": 1.0, "b": 2.0}, scan=10)
    v = judge_slow(before + after, one_model("ab"))
    assert v["b"].slow and v["b"].confidence == "high" and v["b"].history == pytest.approx(2.0)
    alone = [t for t in before + after if t.device == "b"]
    v = judge_slow(alone, one_model("b"))
    assert v["b"].slow and v["b"].basis == "history" and v["b"].confidence == "low"


_speed = st.floats(0.2, 5.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_speed, min_size=2, max_size=7),
    st.floats(0.01, 100.0),
    st.lists(st.floats(0.9, 1.1), min_size=5, max_size=5),
)
def test_scaling_every_device_equally_changes_no_verdict(
    speeds: list[float], scale: float, jitter: list[float]
) -> None:
    named = {f"d{i}": s for i, s in enumerate(speeds)}
    base = judge_slow(timings(named, jitter=jitter), one_model(named))
    scaled = judge_slow(timings({d: s * scale for d, s in named.items()}, jitter=jitter), one_model(named))
    assert {d: v.slow for d, v in base.items()} == {d: v.slow for d, v in scaled.items()}
    identical = judge_slow(timings({d: scale for d in named}, jitter=jitter), one_model(named))
    assert not any(v.slow for v in identical.values())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_speed, min_size=1, max_size=6),
    st.floats(0.0, 0.2),
    st.lists(st.floats(0.5, 1.0), min_size=12, max_size=12),
    st.floats(0.05, 1.0),
)
def test_a_device_within_the_threshold_of_its_peers_is_never_slow(
    peers: list[float], over: float, shrink: list[float], threshold: float
) -> None:
    # "x" is at most (1 + threshold) times its peers' median on every case (often less): never slow
    named = {f"p{i}": s for i, s in enumerate(peers)}
    rows = timings(named)
    worst = {c: statistics.median(t.seconds for t in rows if t.case == c) for c, _, _ in CASES}
    cap = 1 + threshold * over / 0.2
    rows += [
        CaseTiming(
            device="x", case=c, family=f, scan=99, executions=10, seconds=worst[c] * min(cap, 1 + threshold) * shrink[i]
        )
        for i, (c, f, _) in enumerate(CASES)
    ]
    v = judge_slow(rows, one_model([*named, "x"]), SlowSettings(threshold=threshold))
    assert not v["x"].slow


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=40), st.floats(0.5, 0.99))
def test_the_median_lower_bound_is_an_order_statistic_at_or_below_the_median(xs: list[float], c: float) -> None:
    low = median_lower_bound(xs, c)
    if low is not None:
        assert low in xs and low <= sorted(xs)[(len(xs) - 1) // 2]
    if len(xs) >= 12:  # 12 values always bound the median at 95%
        assert median_lower_bound(xs, 0.95) is not None


# ---------------------------------------------------------------------------------- the store and what reads it


def _fill(store: Store, speeds: dict[str, float], *, t: float = NOW - 3600) -> None:
    for n, (d, s) in enumerate(sorted(speeds.items())):
        store.scans.record_devices([DeviceInfo(id=d, host="vm", kind="cpu", model="Xeon", index=n)], now=t)
        sid = store.scans.begin(device=d, host="vm", budget_s=60.0, started_at=t)
        rows = [
            CaseResult(device=d, case=c, family=f, seed=1, passed=True, duration_s=base * s, started_at=t + k)
            for c, f, base in CASES
            for k in range(5)
        ]
        store.scans.record(sid, rows, finish="complete", finished_at=t + 60)


def _slow_incident(device: str, *, t: float = NOW - 600) -> Incident:
    return Incident(
        kind="slow",
        step=12,
        suspect_ranks=(1,),
        device=device,
        devices=(device,),
        hosts=("vm",),
        detail="rank 1 took 1.50x its peer's time for the same micro-batches",
        job="j1",
        time=t,
        job_size=2,
    )


def test_the_report_puts_slow_beside_status_in_json_csv_families_html_and_prometheus(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 2.0})
        rows = {r.device: r for r in build_report(store, since=NOW - 86400, families=True)}
        d = rows["cpu:vm:1"].as_dict()
        assert d["status"] == "healthy" and d["slow"] is True and d["slow_basis"] == "pair"
        assert d["slowdown"] == pytest.approx(2.0) and d["families"]["gemm"]["slow"] is True
        assert rows["cpu:vm:0"].as_dict()["slow"] is False
        table = list(
            csv.reader(io.StringIO("\n".join(",".join(map(str, r)) for r in report_csv_rows(list(rows.values())))))
        )
        head = table[0]
        assert {"slow", "slowdown", "slow_basis", "slow_confidence", "family"} <= set(head)
        slow_rows = [r for r in table[1:] if r[head.index("device")] == "cpu:vm:1"]
        assert all(r[head.index("slow")] == "true" for r in slow_rows)
        prom = render_textfile(store, now=NOW)
        assert 'sdcguard_device_slow{gpu="1",UUID="cpu:vm:1"' in prom and prom.count("sdcguard_slowdown_ratio{") == 2
        page = build_html(store, since=NOW - 86400, window="1d", now=NOW)
        assert 'class="n slow"' in page and ">slow</th>" in page


def test_a_slow_training_incident_marks_the_device_slow_and_never_suspect_or_quarantined(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 1.0})
        for k in range(3):
            store.training.record_incident(_slow_incident("cpu:vm:1", t=NOW - 600 + k))
        rows = {r.device: r.as_dict() for r in build_report(store, since=NOW - 86400)}
        assert rows["cpu:vm:1"]["slow"] is True and rows["cpu:vm:1"]["slow_basis"] == "training"
        assert rows["cpu:vm:1"]["status"] == "healthy"
        out = apply_policy(store, QuarantinePolicy(incident_threshold=1), now=NOW)
        assert out.quarantined == [] and out.slow == ["cpu:vm:1"] and not out.training_breaker_jobs


def test_the_policy_notes_a_slow_device_once_and_drains_it_only_when_configured(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 1.6})
        first = apply_policy(store, now=NOW)
        assert first.quarantined == [] and first.slow == ["cpu:vm:1"]
        assert "slow (pair, medium confidence)" in first.reasons[0]
        assert apply_policy(store, now=NOW + 60).slow == []  # noted once per window
        drained = apply_policy(store, QuarantinePolicy(slow_drain=True), now=NOW + 120)
        assert drained.quarantined == ["cpu:vm:1"]
        assert apply_policy(store, QuarantinePolicy(slow_threshold=1.0), now=NOW + 180).slow == []


def test_fleet_slowness_over_a_store_matches_the_pure_rule(tmp_path: Path) -> None:
    with Store.open(tmp_path / "f.db") as store:
        _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 1.0, "cpu:vm:2": 1.0, "cpu:vm:3": 1.0, "cpu:vm:4": 3.0})
        v = fleet_slowness(store, since=NOW - 86400)
        assert [d for d, x in v.items() if x.slow] == ["cpu:vm:4"] and v["cpu:vm:4"].confidence == "high"
        assert math.isclose(v["cpu:vm:4"].slowdown or 0, 3.0, rel_tol=1e-6)


def test_the_table_shows_the_slow_column(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    with Store.open(db) as store:
        _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 2.0}, t=NOW)
    import time

    if time.time() - NOW > 7 * 86400 or time.time() < NOW:  # the CLI's window ends now: refill at now
        db.unlink()
        with Store.open(db) as store:
            _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 2.0}, t=time.time() - 600)
    r = CliRunner().invoke(cli, ["--db", str(db), "report", "--families"])
    assert r.exit_code == 0, r.output
    assert "SLOW (pair, medium)" in r.output and "2.00x" in r.output
    j = json.loads(CliRunner().invoke(cli, ["--db", str(db), "report", "--format", "json"]).output)
    assert [x["device"] for x in j if x["slow"]] == ["cpu:vm:1"]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("cpu:1:slow,factor=1", "factor must be in (1, 100]"),
        ("cpu:1:slow,rate=0.5", "takes factor=F and case=GLOB only"),
        ("cpu:1:bitflip,factor=2", "factor= goes with the slow pattern"),
        ("cpu:1:slow,factor=abc", "factor must be a number"),
    ],
)
def test_a_bad_slow_drill_is_one_line_exit_2(tmp_path: Path, spec: str, words: str) -> None:
    r = CliRunner().invoke(cli, ["--db", str(tmp_path / "f.db"), "scan", "--inject", spec])
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_scan_help_documents_the_slow_drill() -> None:
    out = CliRunner().invoke(cli, ["scan", "--help"]).output
    assert "slow" in out and "factor=F" in out and "cpu:1:slow,factor=2" in out


def test_the_report_flags_at_the_config_files_slow_threshold(tmp_path: Path) -> None:
    import time

    db = tmp_path / "f.db"
    with Store.open(db) as store:
        _fill(store, {"cpu:vm:0": 1.0, "cpu:vm:1": 2.0}, t=time.time() - 600)
    config = tmp_path / "sdcguard.toml"
    config.write_text("[policy]\nslow_threshold = 1.5\n")
    j = json.loads(
        CliRunner().invoke(cli, ["--db", str(db), "report", "--format", "json", "--config", str(config)]).output
    )
    assert not any(x["slow"] for x in j) and {round(x["slowdown"], 2) for x in j} == {0.5, 2.0}
    config.write_text("[policy]\nslow_threshold = -1\n")
    r = CliRunner().invoke(cli, ["--db", str(db), "report", "--config", str(config)])
    assert r.exit_code == 2 and "slow_threshold" in r.output and len(r.output.strip().splitlines()) == 1


_record = st.tuples(st.integers(0, 9), st.integers(0, 11), st.integers(1, 3), st.integers(0, 6), st.floats(0.9, 1.1))
"""(device, case, scan, executions, jitter): an execution takes the case's base time x the device's speed x jitter."""


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_record, max_size=300),
    st.lists(st.integers(0, 3), min_size=10, max_size=10),
    st.lists(st.floats(0.5, 3.0), min_size=10, max_size=10),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 3),
    st.booleans(),
)
def test_the_array_rule_gives_the_verdicts_of_the_rule_device_by_device(
    records, group_of, speed, min_executions, min_cases, min_peers, separate_history
) -> None:
    # the statistic computed with arrays (a fleet's bulk) equals the reference, record for record, bit for bit
    timings = [
        CaseTiming(
            device=f"d{d}",
            case=f"c{c}",
            family=("gemm", "alu", "ieee")[c % 3],
            scan=sc,
            executions=n,
            seconds=n * CASES[c][2] * speed[d] * j,
        )
        for d, c, sc, n, j in records
    ]
    groups = {f"d{d}": f"g{group_of[d]}" for d in range(10) if d != 9}  # d9: a group of its own
    s = SlowSettings(
        min_executions=min_executions, min_cases=min_cases, min_peers=min_peers, spread_z=1.0, confidence=0.8
    )

    if separate_history:  # means from records without scans, history from the per-scan ones (the store's way)
        per_device = [
            CaseTiming(
                device=t.device, case=t.case, family=t.family, scan=0, executions=t.executions, seconds=t.seconds
            )
            for t in timings
        ]
        got = judge_slow(CaseTimes.from_records(per_device), groups, s, history=timings)
        reference = reference_judge_slow(timings, groups, s)
        # the reference reads means from the per-scan records: the same sums in the same order
        assert got == reference
    else:
        assert judge_slow(timings, groups, s) == reference_judge_slow(timings, groups, s)


@st.composite
def _histories(draw: st.DrawFn) -> list[CaseTiming]:
    """1-4 devices, each with 1-3 scans (of ids in any order) of every case, each scan at a speed of its own; the
    records shuffled, as a store's come in any order of scans."""
    records = []
    for d in range(draw(st.integers(1, 4))):
        for scan in draw(st.lists(st.integers(1, 40), min_size=1, max_size=3, unique=True)):
            speed = draw(st.floats(0.5, 3.0))
            for case, family, base in CASES:
                n = draw(st.integers(0, 6))
                seconds = n * base * speed * draw(st.floats(0.9, 1.1))
                records.append(
                    CaseTiming(
                        device=f"d{d}", case=case, family=family, scan=10 * scan + d, executions=n, seconds=seconds
                    )
                )
    return draw(st.permutations(records))


@settings(max_examples=150, deadline=None)
@given(
    _histories(),
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
    st.integers(1, 4),
    st.integers(1, 8),
    st.sampled_from([0.2, 0.5]),
)
def test_a_devices_history_is_its_latest_scan_against_its_earlier_ones(
    timings: list[CaseTiming], group_of: list[int], min_executions: int, min_cases: int, threshold: float
) -> None:
    """Devices alone (history only), in pairs (history confirms) and in a group of peers, every one with its own
    scans: the library's verdicts, history included, are the reference's, written from the rule's definition."""
    groups = {f"d{d}": f"g{g}" for d, g in enumerate(group_of)}
    s = SlowSettings(threshold=threshold, min_executions=min_executions, min_cases=min_cases, confidence=0.8)
    assert judge_slow(timings, groups, s) == reference_judge_slow(timings, groups, s)
