"""The policy's decision is a pure function of one read: :func:`~sdcguard.fleet.policy.decide` needs no store (its
inputs built by hand here), gives the same verdict for the same inputs, and a run records exactly what it decided
from what :func:`~sdcguard.fleet.policy.read_inputs` read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sdcguard.fleet.policy import PolicyInputs, QuarantinePolicy, apply_policy, decide, read_inputs
from sdcguard.fleet.store.rows import FailedExecution
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, clean, result, scan


def _failure(device: str, *, digest: str = "bad", sticky: bool = True, t: float = NOW - 60) -> FailedExecution:
    return FailedExecution(device=device, case="c", family="gemm", digest=digest, sticky=sticky, started_at=t)


def test_a_node_decides_from_its_inputs_alone() -> None:
    inputs = PolicyInputs(
        now=NOW,
        scope="node",
        devices=None,
        failures=(_failure("sim:1"),),
        passers={"c": frozenset({"sim:1", "sim:2"})},
        pass_digests={"c": frozenset({"good"})},
    )
    verdict = decide(inputs, QuarantinePolicy())
    assert (
        list(verdict.quarantine) == ["sim:1"]
        and "while sim:2 on the same node passed it" in verdict.quarantine["sim:1"]
    )
    assert decide(inputs, QuarantinePolicy()) == verdict  # the same inputs, the same verdict
    # the wrong output is one the case passes with: the fleet's view is needed, the node decides nothing
    older_golden = dataclasses.replace(inputs, pass_digests={"c": frozenset({"good", "bad"})})
    assert decide(older_golden, QuarantinePolicy()).quarantine == {}


def test_the_fleet_rates_a_device_from_the_executions_read() -> None:
    failures = tuple(_failure("sim:1", sticky=False, t=NOW - 60 - k) for k in range(3))
    inputs = PolicyInputs(now=NOW, scope="fleet", devices=None, failures=failures, executions={"sim:1": 100})
    verdict = decide(inputs, QuarantinePolicy())
    assert list(verdict.quarantine) == ["sim:1"] and "failure rate 3/100" in verdict.quarantine["sim:1"]
    assert not verdict.breaker_tripped and verdict.notes == ()
    many = dataclasses.replace(inputs, executions={"sim:1": 10**7})
    assert decide(many, QuarantinePolicy()).quarantine == {}


def test_the_inputs_are_a_value() -> None:
    inputs = PolicyInputs(now=NOW, scope="node", devices=frozenset({"sim:1"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.now = NOW + 1  # type: ignore[misc]


def test_a_run_records_what_was_decided_from_its_read(tmp_path: Path) -> None:
    with Store.open(tmp_path / "fleet.db") as store:
        scan(store, "sim:1", [*clean("sim:1", 97), *[result("sim:1", passed=False, t=NOW - 5 - i) for i in range(3)]])
        scan(store, "sim:2", [*clean("sim:2", 50), result("sim:2", passed=False, sticky=True, t=NOW - 5)])
        scan(store, "sim:3", clean("sim:3", 100))
        policy = QuarantinePolicy()
        verdict = decide(read_inputs(store, policy, now=NOW, devices=None, scope="fleet"), policy)
        out = apply_policy(store, policy, now=NOW)
    assert sorted(verdict.quarantine) == sorted(out.quarantined) == ["sim:1", "sim:2"]
    assert [d.reason for d in out.decisions] == [f"{d}: {why}" for d, why in verdict.quarantine.items()]
