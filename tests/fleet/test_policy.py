"""The quarantine policy: its rules, the circuit breaker, probation, recorded decisions, and actions."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.errors import BadInput
from sdcguard.fleet.actions import ActionTemplate, run_action
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, clean, result, scan


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "fleet.db")
    yield s
    s.close()


def _decisions(store: Store) -> list[tuple[str | None, str]]:
    return [(d.device, d.decision) for d in store.quarantine.decisions()]


def test_sticky_failure_quarantines_and_is_recorded(store: Store) -> None:
    scan(store, "sim:1", [*clean("sim:1", 5000), result("sim:1", passed=False, sticky=True, t=NOW - 10)])
    scan(store, "sim:2", clean("sim:2", 100))
    out = apply_policy(store, QuarantinePolicy(), now=NOW)
    assert out.quarantined == ["sim:1"] and not out.breaker_tripped
    assert "sticky" in out.reasons[0]
    assert store.quarantine.status("sim:1") == "quarantined"
    assert store.quarantine.status("sim:2", now=NOW) == "healthy"
    assert _decisions(store) == [("sim:1", "quarantine")]
    (h,) = store.quarantine.history("sim:1")
    assert h["by"] == "policy" and "sticky" in h["reason"]
    # A second run changes nothing and decides nothing new.
    again = apply_policy(store, QuarantinePolicy(), now=NOW + 1)
    assert again.quarantined == [] and len(_decisions(store)) == 1


def test_rate_lower_bound_above_threshold_quarantines(store: Store) -> None:
    # 3 failures in 100: rate_low ~ 0.008 > 0.001. One failure in 5,000: rate_low ~1e-5, only suspect.
    scan(store, "sim:1", [*clean("sim:1", 97), *[result("sim:1", passed=False, t=NOW - 5 - i) for i in range(3)]])
    scan(store, "sim:2", [*clean("sim:2", 4999), result("sim:2", passed=False, t=NOW - 5)])
    out = apply_policy(store, now=NOW)
    assert out.quarantined == ["sim:1"]
    assert "lower 95% bound" in out.reasons[0]
    assert store.quarantine.status("sim:2", now=NOW) == "suspect"
    # A lower threshold (quicker to quarantine) takes sim:2 too.
    assert apply_policy(store, QuarantinePolicy(rate_threshold=1e-6), now=NOW).quarantined == ["sim:2"]


def test_repeated_training_incidents_quarantine(store: Store) -> None:
    for step in (10, 20):
        store.training.record_incident(
            Incident(
                kind="replay",
                step=step,
                suspect_ranks=(3,),
                device="sim:3",
                detail="x",
                devices=("sim:3",),
                hosts=("node3",),
                time=NOW - 100,
            )
        )
    store.training.record_incident(
        Incident(
            kind="replay",
            step=5,
            suspect_ranks=(4,),
            device="sim:4",
            detail="x",
            devices=("sim:4",),
            hosts=("node4",),
            time=NOW - 100,
        )
    )
    store.training.record_incident(
        Incident(
            kind="replay",
            step=1,
            suspect_ranks=(4,),
            device="sim:4",
            detail="old",
            devices=("sim:4",),
            hosts=("node4",),
            time=NOW - 30 * 86400,
        )
    )
    out = apply_policy(store, now=NOW)
    assert out.quarantined == ["sim:3"]
    assert "2 training incidents" in out.reasons[0]


def test_same_wrong_digest_on_two_devices_trips_the_breaker(store: Store) -> None:
    for d in ("sim:1", "sim:2"):
        scan(store, d, [*clean(d, 10), result(d, passed=False, sticky=True, digest="ab" * 32, t=NOW - 5)])
    out = apply_policy(store, now=NOW)
    assert out.breaker_tripped and out.quarantined == []
    assert "same wrong output" in out.reasons[0] and "nobody quarantined" in out.reasons[0]
    assert store.quarantine.entries() == []
    assert _decisions(store) == [(None, "breaker")]
    # Operators see it from the CLI too.
    from click.testing import CliRunner

    from sdcguard.cli import cli

    r = CliRunner().invoke(
        cli, ["--db", str(store.path), "quarantine", "decisions", "--since", "all", "--format", "json"]
    )
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["decision"] == "breaker"


def test_share_of_devices_failing_one_case_trips_the_breaker(store: Store) -> None:
    for i in range(8):
        d = f"sim:{i}"
        bad = i < 3  # 3 of 8 devices fail the same case with different outputs: 37% > 25%
        scan(store, d, [*clean(d, 10), *([result(d, passed=False, sticky=True, t=NOW - 5)] if bad else [])])
    out = apply_policy(store, now=NOW)
    assert out.breaker_tripped and out.quarantined == []
    assert "3 of 8 devices failed case" in out.reasons[0]
    # The same with a looser share: quarantined one by one.
    assert apply_policy(store, QuarantinePolicy(breaker_share=0.5), now=NOW).quarantined == ["sim:0", "sim:1", "sim:2"]


def test_one_bad_device_among_few_does_not_trip_the_breaker(store: Store) -> None:
    for i in range(2):
        d = f"sim:{i}"
        scan(store, d, [*clean(d, 10), *([result(d, passed=False, sticky=True, t=NOW - 5)] if i == 0 else [])])
    out = apply_policy(store, now=NOW)
    assert not out.breaker_tripped and out.quarantined == ["sim:0"]


def test_probation_ends_after_clean_scans_and_a_failure_requarantines(store: Store) -> None:
    scan(store, "sim:1", clean("sim:1", 10), t=NOW - 10_000)
    scan(store, "sim:2", clean("sim:2", 10), t=NOW - 10_000)
    for d in ("sim:1", "sim:2"):
        store.quarantine.add(d, reason="bad", now=NOW - 9000)
        store.quarantine.release(d, reason="fixed", now=NOW - 8000)
    policy = QuarantinePolicy(probation_clean_scans=3)
    for i in range(2):
        scan(store, "sim:1", clean("sim:1", 10, t=NOW - 7000 + i * 100), t=NOW - 7000 + i * 100)
    assert apply_policy(store, policy, now=NOW).released == []
    assert store.quarantine.status("sim:1") == "probation"
    scan(store, "sim:1", clean("sim:1", 10, t=NOW - 6000), t=NOW - 6000)
    scan(store, "sim:2", [*clean("sim:2", 5000, t=NOW - 6000), result("sim:2", passed=False, t=NOW - 100)])
    out = apply_policy(store, policy, now=NOW)
    assert out.released == ["sim:1"] and out.quarantined == ["sim:2"]
    assert store.quarantine.status("sim:1", now=NOW) == "healthy"
    assert store.quarantine.status("sim:2") == "quarantined"
    assert "probation" in [r for r in out.reasons if r.startswith("sim:2")][0]
    assert [h["action"] for h in store.quarantine.history("sim:1")] == ["quarantine", "release", "probation_passed"]


def test_a_scan_that_executed_nothing_never_counts_toward_probation(store: Store) -> None:
    """A complete scan of zero executions tested nothing: not a clean scan, not a scan in the report, no
    last_scan."""
    scan(store, "sim:1", clean("sim:1", 10), t=NOW - 10_000)
    store.quarantine.add("sim:1", reason="bad", now=NOW - 9000)
    store.quarantine.release("sim:1", reason="fixed", now=NOW - 8000)
    for i in range(5):
        scan(store, "sim:1", [], t=NOW - 7000 + i * 100)  # complete, 0 executions
    policy = QuarantinePolicy(probation_clean_scans=3)
    assert apply_policy(store, policy, now=NOW).released == []
    assert store.quarantine.status("sim:1") == "probation"
    counts = store.counts.scans(since=NOW - 8000)["sim:1"]
    assert counts.complete == 0 and counts.last_complete == NOW - 10_000 + 60
    for i in range(3):
        scan(store, "sim:1", clean("sim:1", 1, t=NOW - 5000 + i * 100), t=NOW - 5000 + i * 100)
    assert apply_policy(store, policy, now=NOW).released == ["sim:1"]


def test_devices_scope_limits_quarantine(store: Store) -> None:
    for d in ("sim:1", "sim:2"):
        scan(store, d, [result(d, passed=False, sticky=True, t=NOW - 5)])
    out = apply_policy(store, devices=["sim:2"], now=NOW)
    assert out.quarantined == ["sim:2"]


def test_policy_validates_its_settings() -> None:
    with pytest.raises(ValueError):
        QuarantinePolicy(confidence=1.5)
    with pytest.raises(ValueError):
        QuarantinePolicy(breaker_same_digest_devices=1)
    with pytest.raises(TypeError):
        QuarantinePolicy(0.5)  # keyword-only


# ---------------------------------------------------------------- actions
def _recorder(tmp_path: Path, name: str, exit_code: int = 0) -> Path:
    """A script that appends its argv (as JSON) to a log and exits with ``exit_code``."""
    log = tmp_path / f"{name}.log"
    script = tmp_path / name
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\nsys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _calls(tmp_path: Path, name: str) -> list[list[str]]:
    log = tmp_path / f"{name}.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_actions_get_argv_without_a_shell_and_failures_are_retried(store: Store, tmp_path: Path) -> None:
    drain = _recorder(tmp_path, "drain")
    broken = _recorder(tmp_path, "broken", exit_code=3)
    store.scans.record_devices([__import__("sdcguard").DeviceInfo(id="sim:1", host="node7", kind="sim")])
    scan(store, "sim:1", [result("sim:1", passed=False, sticky=True, t=NOW - 5)], host="node7")
    actions = [
        ActionTemplate(name="broken", argv=(str(broken), "{device}")),
        ActionTemplate(name="missing", argv=(str(tmp_path / "no-such-program"), "{host}")),
        ActionTemplate(
            name="drain", argv=(str(drain), "NodeName={host}", "--dev", "{device}", "Reason={reason}; rm -rf /")
        ),
    ]
    out = apply_policy(store, now=NOW, actions=actions)
    assert out.quarantined == ["sim:1"]
    # The failing and the missing programs did not stop the drain.
    (argv,) = _calls(tmp_path, "drain")
    assert argv[:3] == ["NodeName=node7", "--dev", "sim:1"]
    assert argv[3].startswith("Reason=sticky failure") and argv[3].endswith("; rm -rf /")  # one argument, no shell
    assert sorted(out.actions_failed) == [("sim:1", "broken"), ("sim:1", "missing")]
    assert out.actions_ok == [("sim:1", "drain")]
    attempts = store.quarantine.action_attempts()
    assert sorted((r["action"], r["ok"], r["returncode"]) for r in attempts) == [
        ("broken", 0, 3),
        ("drain", 1, 0),
        ("missing", 0, None),
    ]
    # Next run: the failures are retried, the success is not repeated.
    out2 = apply_policy(store, now=NOW + 60, actions=actions)
    assert len(_calls(tmp_path, "drain")) == 1 and len(_calls(tmp_path, "broken")) == 2
    assert sorted(out2.actions_failed) == [("sim:1", "broken"), ("sim:1", "missing")]
    # Once it works, it is done.
    _recorder(tmp_path, "broken", exit_code=0)
    out3 = apply_policy(store, now=NOW + 120, actions=actions)
    assert out3.actions_ok == [("sim:1", "broken")] and len(_calls(tmp_path, "broken")) == 3


def test_action_timeout_is_a_failure(tmp_path: Path) -> None:
    slow = ActionTemplate(name="slow", argv=(sys.executable, "-c", "import time; time.sleep(10)"), timeout_s=0.5)
    r = run_action(slow, device="sim:1", host="h", reason="x")
    assert not r.ok and "timed out" in r.output


def test_action_template_validation() -> None:
    with pytest.raises(BadInput, match="unknown placeholder"):
        ActionTemplate(name="x", argv=("echo", "{hostname}"))
    with pytest.raises(BadInput, match="argv"):
        ActionTemplate(name="x", argv=())
    assert ActionTemplate.slurm_drain().render(device="GPU-1", host="n1", reason="r")[:3] == [
        "scontrol",
        "update",
        "NodeName=n1",
    ]
    assert "n1" in ActionTemplate.kubernetes_taint().render(device="GPU-1", host="n1", reason="r")


# ---------------------------------------------------------------- invariants over random fleets
_device_history = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["alu.a", "alu.b"]), st.sampled_from(["d1", "d2", None]), st.booleans()),
    max_size=6,
)


@settings(max_examples=25)
@given(st.lists(st.tuples(st.integers(0, 400), _device_history), min_size=1, max_size=6))
def test_policy_invariants(tmp_path_factory: pytest.TempPathFactory, fleet) -> None:
    """Breaker => nobody quarantined; every quarantine has a recorded reason; a rerun changes nothing."""
    with Store.open(tmp_path_factory.mktemp("pol") / "f.db") as store:
        for i, (n_clean, fails) in enumerate(fleet):
            d = f"sim:{i}"
            rows = clean(d, n_clean, t=NOW - 5000)
            rows += [
                result(d, passed=False, case=c, digest=(dg * 32) if dg else None, sticky=s, t=NOW - 100)
                for _, c, dg, s in fails
                if _
            ]
            scan(store, d, rows)
        out = apply_policy(store, now=NOW)
        if out.breaker_tripped:
            assert out.quarantined == [] and store.quarantine.entries() == []
            assert any("circuit breaker" in r for r in out.reasons)
        decided = {d.device: d.reason for d in store.quarantine.decisions() if d.decision == "quarantine"}
        assert set(decided) == set(out.quarantined)
        assert all(decided[d] for d in decided)
        assert {e.device for e in store.quarantine.entries()} == set(out.quarantined)
        for d in out.quarantined:
            assert [h["action"] for h in store.quarantine.history(d)] == ["quarantine"]
        again = apply_policy(store, now=NOW + 1)
        assert again.quarantined == [] and again.breaker_tripped == out.breaker_tripped
        assert {e.device for e in store.quarantine.entries()} == set(out.quarantined)


def test_failures_blamed_on_the_suite_are_never_evidence_later(store: Store) -> None:
    # A bad golden file: two devices give the same wrong output two days ago. The breaker window (1 day) has
    # passed, the rate window (7 days) has not: those failures must still not quarantine anyone.
    for d in ("sim:1", "sim:2"):
        scan(store, d, [*clean(d, 10), result(d, passed=False, sticky=True, digest="cd" * 32, t=NOW - 2 * 86400)])
    out = apply_policy(store, now=NOW)
    assert not out.breaker_tripped and out.quarantined == []
    # A device failing on its own (its own wrong output) is still quarantined in the same run.
    scan(store, "sim:3", [*clean("sim:3", 10), result("sim:3", passed=False, sticky=True, digest="ef" * 32, t=NOW - 5)])
    out = apply_policy(store, now=NOW)
    assert out.quarantined == ["sim:3"]
