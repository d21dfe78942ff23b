"""A release is a boundary of evidence: whatever scans, failures, incidents, releases, holds and policy runs came in
whatever order, on both backends, no policy run quarantines a device over evidence older than its last release by
hand, and no policy run lifts a hold (``quarantine add``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sdcguard.fleet.policy import QuarantinePolicy, apply_policy
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, result, scan
from tests.conftest import BACKENDS

DEVICES = ("sim:0", "sim:1", "sim:2")
HOUR = 3600.0

_op = st.one_of(
    st.tuples(st.just("scan"), st.sampled_from(DEVICES), st.sampled_from(["clean", "sticky", "one-off"])),
    st.tuples(st.sampled_from(["release", "hold", "incident"]), st.sampled_from(DEVICES), st.just("")),
    st.tuples(st.just("policy"), st.just(""), st.sampled_from(["fleet", "node"])),
)


STICKY_THEN_RELEASED = [
    ("scan", "sim:1", "sticky"),
    ("policy", "", "fleet"),
    ("release", "sim:1", ""),
    ("scan", "sim:1", "clean"),
    ("policy", "", "node"),
    ("policy", "", "fleet"),
]
"""The issue's drill: a sticky failure, quarantined, released, and the next clean scan's policy runs (node, fleet)."""
INCIDENTS_THEN_RELEASED = [
    ("incident", "sim:2", ""),
    ("incident", "sim:2", ""),
    ("policy", "", "fleet"),
    ("release", "sim:2", ""),
    ("policy", "", "fleet"),
]
"""Two training incidents quarantine; after the release they are history, also to the training breaker."""
RATE_HELD_RELEASED = [
    ("scan", "sim:0", "one-off"),
    ("hold", "sim:0", ""),
    ("policy", "", "fleet"),
    ("release", "sim:0", ""),
    ("policy", "", "fleet"),
    ("scan", "sim:0", "one-off"),
    ("policy", "", "fleet"),
]
"""A one-off failure's rate under a hold, released: not again for it; a new failure after the release: at once."""


@pytest.mark.parametrize("backend", BACKENDS)
@example(ops=STICKY_THEN_RELEASED)
@example(ops=INCIDENTS_THEN_RELEASED)
@example(ops=RATE_HELD_RELEASED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=16))
def test_no_device_is_quarantined_by_evidence_older_than_its_last_release(
    backend: str, new_store: Callable[[str], str], ops: list[tuple[str, str, str]]
) -> None:
    url = new_store(backend)
    policy = QuarantinePolicy(probation_clean_scans=2)
    evidence: dict[str, list[float]] = {d: [] for d in DEVICES}  # when each device failed or was named
    released: dict[str, float] = {}
    held: set[str] = set()  # quarantined by hand, not released since
    clock = NOW - 3 * 24 * HOUR
    with Store.open(url) as store:
        for d in DEVICES:  # every device known, with a clean scan (the node's peers)
            scan(store, d, [result(d, t=clock + i) for i in range(4)], t=clock)
        for kind, device, how in ops:
            clock += HOUR
            state = store.quarantine.states().get(device)
            if kind == "scan":
                rows = [result(device, t=clock + i) for i in range(20)]
                if how != "clean":
                    rows.append(result(device, passed=False, t=clock + 30, sticky=how == "sticky"))
                    evidence[device].append(clock + 30)
                scan(store, device, rows, t=clock)
            elif kind == "incident":
                store.training.record_incident(
                    Incident(
                        kind="replay",
                        step=int(clock),
                        suspect_ranks=(0,),
                        device=device,
                        detail="x",
                        devices=(device,),
                        hosts=("node1",),
                        time=clock,
                        job="job",
                    )
                )
                evidence[device].append(clock)
            elif kind == "release" and state == "quarantined":
                store.quarantine.release(device, reason="board swapped", by="ops", now=clock)
                released[device] = clock
                held.discard(device)
            elif kind == "hold" and state != "quarantined":
                store.quarantine.add(device, reason="MCE in dmesg", by="ops", now=clock)
                held.add(device)
            elif kind == "policy":
                out = apply_policy(store, policy, now=clock, scope=how)  # type: ignore[arg-type]
                for d in out.quarantined:
                    since = released.get(d, float("-inf"))
                    assert any(t >= since for t in evidence[d]), (
                        f"{d} quarantined by the {how} policy at {clock} over evidence older than its release "
                        f"at {since}: {evidence[d]}; {out.reasons}"
                    )
                states = store.quarantine.states()
                assert all(states.get(d) == "quarantined" for d in held), (held, states)
                for d, since in released.items():
                    if states.get(d) == "quarantined" and d not in held:
                        assert any(t >= since for t in evidence[d]), (d, since, evidence[d])
                assert not held & set(out.released)


def test_a_drill_released_then_scanned_clean_stays_released(new_store: Callable[[str], str]) -> None:
    """The issue's case: a sticky failure quarantines, the operator releases, the next clean scan's policy run (node
    and fleet) leaves the device on probation, and two more clean scans end the probation."""
    with Store.open(new_store("sqlite")) as store:
        t = NOW - 5 * HOUR
        for d in DEVICES:
            scan(store, d, [result(d, t=t + i) for i in range(4)], t=t)
        scan(store, "sim:1", [result("sim:1", passed=False, sticky=True, t=t + HOUR)], t=t + HOUR)
        assert apply_policy(store, now=t + HOUR + 100).quarantined == ["sim:1"]
        store.quarantine.release("sim:1", reason="drill over", by="ops", now=t + 2 * HOUR)
        for k in range(3):
            at = t + (3 + k) * HOUR
            scan(store, "sim:1", [result("sim:1", t=at + i) for i in range(5)], t=at)
            assert apply_policy(store, now=at + 100, scope="node").quarantined == []
            assert apply_policy(store, QuarantinePolicy(probation_clean_scans=3), now=at + 100).quarantined == []
        assert "sim:1" not in store.quarantine.states()
        assert store.quarantine.status("sim:1", now=t + 6 * HOUR) == "healthy"
