"""The circuit breaker counts the devices that ran a failing case only as far as its verdict needs (a bucket whose
failures alone are judged stops at the fewest devices for which the share is not exceeded): every verdict, trip
message and blamed device equals that of the breaker given every bucket's exact count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard.fleet.breaker import judge_suite, read_suite_evidence
from sdcguard.fleet.policy import QuarantinePolicy
from sdcguard.fleet.store.failures import Failures
from sdcguard.fleet.store.rows import CaseCoverage
from sdcguard.fleet.store.store import Store
from tests._fleet import result, scan

DAY = 86400.0
START = 20_000 * DAY


class _Exact:
    """The store's failures, their coverage counted whole whatever ``enough`` says (the breaker before counts
    stopped)."""

    def __init__(self, failures: Failures) -> None:
        self._failures = failures

    def case_coverage(self, *args: Any, enough: Any = None, **kw: Any) -> list[CaseCoverage]:
        return self._failures.case_coverage(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._failures, name)


# per device: (day, case, passed, digest) of its executions; few digests, so shared wrong outputs happen
_execution = st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans(), st.sampled_from(["", "aa", "bb"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fleet=st.lists(st.lists(_execution, min_size=1, max_size=5), min_size=1, max_size=12),
    share=st.sampled_from([0.1, 0.2, 0.25, 1 / 3, 0.5, 0.7, 1.0]),
    min_devices=st.integers(1, 4),
)
def test_the_verdict_with_counts_stopped_early_equals_the_verdict_with_exact_counts(
    tmp_path_factory: Any, fleet: list, share: float, min_devices: int
) -> None:
    path: Path = tmp_path_factory.mktemp("breaker") / "s.db"
    policy = QuarantinePolicy(breaker_share=share, breaker_min_devices=min_devices)
    with Store.open(path) as s:
        for n, executions in enumerate(fleet):
            dev = f"sim:{n}"
            scan(
                s,
                dev,
                [
                    result(dev, case=f"c{c}", t=START + day * DAY + 60 * k, passed=ok, digest=None if ok else g or None)
                    for k, (day, c, ok, g) in enumerate(executions)
                ],
                t=START,
            )
        failures = s.failures.executions(since=START)
        now = START + 3 * DAY
        counted = read_suite_evidence(failures, policy, source=s.failures, since=START)
        whole = read_suite_evidence(failures, policy, source=_Exact(s.failures), since=START)  # type: ignore[arg-type]
        capped = judge_suite(failures, counted, policy, now=now)
        exact = judge_suite(failures, whole, policy, now=now)
    assert capped == exact
