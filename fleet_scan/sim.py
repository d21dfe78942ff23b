"""The ``sim:`` backend: a simulated fleet scanned daily through the real store and the real quarantine policy.

Each simulated device has a per-execution failure probability (0 for healthy hardware, plus a rare transient
rate on every device). A day's scan of a device does what :mod:`fleet_scan.worker` does, at the level the policy
sees: ``begin_scan``, the executions the default budget allows spread over the suite in the scanner's own order
(:func:`fleet_scan.schedule.order_cases`, past failures first), a retest of each failing case (reproduced with the
device's own probability: a transient does not come back, the golden data's fault always does), and the final
batch with ``finish="complete"``; then :func:`sdcguard.fleet.policy.apply_policy` runs over the fleet once a day.

To stay fast at 10,000 devices x 30 days, one result row stands for a day's *passing* executions of one case
(``CaseResult.executions``); every failed execution is its own row, with its own output digest. That is the only
shortcut: the rates, the breaker and the quarantines are the store's and the policy's.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdcguard.devices import sim_id
from sdcguard.records import CaseResult, DeviceInfo

from .options import DEFAULT_BUDGET_S, DEFAULT_RETESTS
from .schedule import order_cases

__all__ = ["SimCase", "SimFleet", "SimDay", "SimRun", "simulate", "scan_sim_device", "DEFAULT_CASES"]

_FAMILIES = ("gemm", "alu", "ieee", "intrinsics", "memory", "shared")


@dataclass(frozen=True, kw_only=True)
class SimCase:
    """A simulated golden case (the real suite's families, a nominal wall time per execution)."""

    id: str
    family: str
    seed: int = 0
    seconds: float = 0.02


DEFAULT_CASES: tuple[SimCase, ...] = tuple(
    SimCase(id=f"sim.{family}.{i}", family=family, seed=1000 * k + i)
    for k, family in enumerate(_FAMILIES)
    for i in range(1)
)
"""One case per family: the policy sees per-case rows (the breaker counts devices per case), and one row per case
and day keeps 10,000 devices x 30 days affordable."""


@dataclass(frozen=True, kw_only=True)
class SimFleet:
    """A fleet: which devices are defective and how often each device fails one execution."""

    devices: int = 10_000
    defective_share: float = 1e-3
    """Share of defective devices (Meta: about one in a thousand)."""
    p_low: float = 1e-5
    p_high: float = 1e-1
    """Defective devices' per-execution failure probabilities, log-uniform over [p_low, p_high]."""
    transient_rate: float = 1e-8
    """Per-execution probability of a one-off (non-reproducible) wrong result on any device, healthy included."""
    devices_per_host: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError("devices must be >= 1")
        if not 0 <= self.defective_share <= 1:
            raise ValueError("defective_share must be in [0, 1]")
        if not 0 < self.p_low <= self.p_high < 1:
            raise ValueError("need 0 < p_low <= p_high < 1")
        if not 0 <= self.transient_rate < 1:
            raise ValueError("transient_rate must be in [0, 1)")

    def failure_probabilities(self) -> np.ndarray:
        """Per-device probability of a *reproducible* failure per execution (0 for healthy devices)."""
        rng = np.random.default_rng([self.seed, 1])
        n_bad = int(round(self.devices * self.defective_share))
        p = np.zeros(self.devices)
        bad = rng.choice(self.devices, size=n_bad, replace=False)
        p[bad] = np.exp(rng.uniform(math.log(self.p_low), math.log(self.p_high), size=n_bad))
        return p

    def host(self, n: int) -> str:
        return f"simhost{n // self.devices_per_host:05d}"


@dataclass
class SimDay:
    """What the policy did on one day."""

    day: int
    quarantined: list[str] = field(default_factory=list)
    breaker_tripped: bool = False
    reasons: list[str] = field(default_factory=list)
    failures: int = 0
    executions: int = 0


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _failure(dev: str, case: SimCase, t: float, digest: str, element: int) -> CaseResult:
    return CaseResult(
        device=dev, case=case.id, family=case.family, seed=case.seed, passed=False, duration_s=case.seconds,
        started_at=t, output_digest=digest, mismatches=1, element=element, expected="0x3f800000",
        actual="0x3f800001", xor_mask="0x00000001", location=f"sim:{dev}",
    )


@functools.lru_cache(maxsize=256)
def _plan(cases: tuple[SimCase, ...], past: tuple[tuple[str, int], ...]) -> list[SimCase]:
    return order_cases(cases, dict(past))


def scan_sim_device(
    store: Any,
    *,
    dev: str,
    host: str,
    p_fault: float,
    transient_rate: float,
    t: float,
    cases: Sequence[SimCase],
    past_failures: dict[str, int],
    budget_s: float,
    retests: int,
    rng: np.random.Generator,
    bad_case: str | None = None,
) -> tuple[int, int, set[str]]:
    """One day's scan of one simulated device through the store; (executions, failures, failing families)."""
    plan = _plan(tuple(cases), tuple(sorted(past_failures.items())))
    # As the real budget loop: cycles of the plan while the next case fits (the final flush reserve kept free).
    total = int((budget_s - 0.05) / (sum(c.seconds for c in plan) / len(plan)))
    base, extra = divmod(total, len(plan))
    scan_id = store.begin_scan(device=dev, host=host, budget_s=budget_s, meta={"sim": True}, started_at=t)
    results: list[CaseResult] = []
    executions = failures = 0
    failing_families: set[str] = set()
    p = min(1.0, p_fault + transient_rate)
    for i, case in enumerate(plan):
        n = base + (i < extra)
        if n == 0:
            continue
        at = t + budget_s * i / len(plan)
        if case.id == bad_case:
            k, digest = n, _digest("bad-golden", case.id)  # every device's right answer differs from the bad file
        else:
            k, digest = int(rng.binomial(n, p)), ""
        executions += n
        if n - k:
            results.append(
                CaseResult(device=dev, case=case.id, family=case.family, seed=case.seed, passed=True,
                           duration_s=(n - k) * case.seconds, started_at=at, executions=n - k)
            )
        if not k:
            continue
        failures += k
        failing_families.add(case.family)
        fails = [
            _failure(dev, case, at + j * case.seconds, digest or _digest(dev, case.id, rng.integers(1 << 62)), j)
            for j in range(k)
        ]
        if retests:
            if case.id == bad_case:
                again = retests
            else:  # a transient does not come back; a faulty unit fails again with its own probability
                again = int(rng.binomial(retests, p_fault)) if p_fault else 0
            fails[0] = dataclasses.replace(fails[0], sticky=again > 0)
            for a in range(1, retests + 1):
                if a <= again:
                    fails.append(dataclasses.replace(
                        _failure(dev, case, at, digest or _digest(dev, case.id, "retest", a), 0), attempt=a))
                else:
                    fails.append(CaseResult(device=dev, case=case.id, family=case.family, seed=case.seed,
                                            passed=True, duration_s=case.seconds, started_at=at, attempt=a))
        results.extend(fails)
    store.record_results(scan_id, results, finish="complete", finished_at=t + budget_s)
    return executions, failures, failing_families


class SimRun:
    """A fleet being scanned day by day into one store; :meth:`fork` continues the same history in a copy."""

    def __init__(
        self,
        store_path: Path,
        fleet: SimFleet,
        policy: Any,
        *,
        budget_s: float = DEFAULT_BUDGET_S,
        retests: int = DEFAULT_RETESTS,
        cases: Sequence[SimCase] = DEFAULT_CASES,
        start: float = 1_767_225_600.0,
    ) -> None:
        from sdcguard.fleet.store import Store

        self.store_path = Path(store_path)
        self.fleet = fleet
        self.policy = policy
        self.budget_s = budget_s
        self.retests = retests
        self.cases = tuple(cases)
        self.start = start
        self.p = fleet.failure_probabilities()
        self.rng = np.random.default_rng([fleet.seed, 2])
        self.ids = [sim_id(n) for n in range(fleet.devices)]
        self.quarantined_on: dict[str, int] = {}
        self.past: dict[str, dict[str, int]] = {}
        self.log: list[SimDay] = []
        self.store = Store.open(self.store_path)
        for n, dev in enumerate(self.ids):
            self.store.upsert_device(DeviceInfo(id=dev, host=fleet.host(n), kind="sim", model="simulated"), now=start)

    def close(self) -> None:
        self.store.close()

    def day(self, day: int, *, bad_case: str | None = None) -> SimDay:
        """Scan every device not quarantined, then run the policy once (``bad_case``: the bad golden file)."""
        from sdcguard.fleet.policy import apply_policy

        t_day = self.start + day * 86400.0
        today = SimDay(day=day)
        for n, dev in enumerate(self.ids):
            if dev in self.quarantined_on:
                continue
            ex, fa, fams = scan_sim_device(
                self.store, dev=dev, host=self.fleet.host(n), p_fault=float(self.p[n]),
                transient_rate=self.fleet.transient_rate, t=t_day + 60.0 * (n % 60), cases=self.cases,
                past_failures=self.past.get(dev, {}), budget_s=self.budget_s, retests=self.retests, rng=self.rng,
                bad_case=bad_case,
            )
            today.executions += ex
            today.failures += fa
            for f in fams:
                self.past.setdefault(dev, {})[f] = self.past.get(dev, {}).get(f, 0) + 1
        outcome = apply_policy(self.store, self.policy, now=t_day + 7200.0)
        today.quarantined = list(outcome.quarantined)
        today.breaker_tripped = outcome.breaker_tripped
        today.reasons = [r for r in outcome.reasons if "breaker" in r][:3]
        for dev in outcome.quarantined:
            self.quarantined_on.setdefault(dev, day)
        self.log.append(today)
        return today

    def fork(self, store_path: Path) -> SimRun:
        """The same fleet, history and random state, continuing in a copy of the store at ``store_path``."""
        from sdcguard.fleet.store import Store

        self.store.close()  # the last connection closing checkpoints the WAL into the file
        shutil.copyfile(self.store_path, store_path)
        self.store = Store.open(self.store_path)
        other = copy.copy(self)
        other.store_path = Path(store_path)
        other.store = Store.open(other.store_path)
        other.rng = copy.deepcopy(self.rng)
        other.quarantined_on = dict(self.quarantined_on)
        other.past = copy.deepcopy(self.past)
        other.log = list(self.log)
        return other


def simulate(
    store_path: Path,
    fleet: SimFleet,
    policy: Any,
    *,
    days: int = 30,
    budget_s: float = DEFAULT_BUDGET_S,
    retests: int = DEFAULT_RETESTS,
    cases: Sequence[SimCase] = DEFAULT_CASES,
    bad_golden_day: int | None = 10,
    bad_golden_case: str | None = None,
) -> SimRun:
    """Scan the fleet daily for ``days`` days; quarantined devices are no longer scanned.

    The bad golden file (a wrong expected output for ``bad_golden_case``) is present on ``bad_golden_day`` only
    (rolled back the next day). Returns the run (``quarantined_on``, ``log``, ``p``), its store closed.
    """
    run = SimRun(store_path, fleet, policy, budget_s=budget_s, retests=retests, cases=cases)
    bad_case = bad_golden_case or run.cases[len(run.cases) // 2].id
    for day in range(days):
        run.day(day, bad_case=bad_case if day == bad_golden_day else None)
    run.close()
    return run
