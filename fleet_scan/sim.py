"""The ``sim:`` backend: a simulated fleet scanned daily the way it is deployed.

Each host (``devices_per_host`` devices) has its own node store, as on Kubernetes or Slurm. A day's scan of a device
does what :mod:`fleet_scan.device_scan.worker` does, at the level the store and the policy see: ``store.scans.begin``,
the executions the default budget allows spread over the real suite's cases in the scanner's own order
(:func:`fleet_scan.device_scan.schedule.order_cases`, past failures first), a retest of each failing case (reproduced
with the device's own probability: a transient does not come back, a bad golden file always does), and the final batch
with ``finish="complete"``. The store folds the passing executions of each case into one row per scan, exactly as it
does for the scanner; every failed execution is its own row with its own output digest. Then each node applies the node
policy to its own store (``scope="node"``), the fleet store merges every node store (incrementally) and the fleet policy
runs on it (``scope="fleet"``), as ``deploy/`` does.

Faults: a defective device fails any execution with its probability; every device has a rare transient rate; a
**bad golden file** (one day) makes every device fail one case with its right answer, which is the output the
case passes with the other days; a **batch sharing one defect** fails one case with the same wrong output on
every device of the batch (same inputs, same fault), half of the batch two to a host.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sdcguard.devices import sim_id
from sdcguard.durations import DAY_S
from sdcguard.golden.cases import PORTABLE_CASES
from sdcguard.records import CaseResult, DeviceInfo

from .device_scan.schedule import order_cases
from .options import DEFAULT_BUDGET_S, DEFAULT_RETESTS

__all__ = ["SimCase", "SimFleet", "SimDay", "SimRun", "scan_sim_device", "DEFAULT_CASES"]


@dataclass(frozen=True, kw_only=True)
class SimCase:
    """A simulated golden case (a real case's id, family and seed; a nominal wall time per execution)."""

    id: str
    family: str
    seed: int = 0
    seconds: float = 0.02


DEFAULT_CASES: tuple[SimCase, ...] = tuple(SimCase(id=c.id, family=c.family, seed=c.seed) for c in PORTABLE_CASES)
"""The CPU suite's cases: a simulated scan writes as many rows as a real one."""


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
    shared_defect_devices: int = 0
    """Devices of a batch sharing one defect (on top of the defective share)."""
    shared_defect_p: float = 0.05
    """Probability that the batch's defect corrupts one execution of its case."""
    devices_per_host: int = 8
    seed: int = 0
    slow_devices: int = 0
    """Devices slower than their peers (throttled: right answers, slowly), drawn from the healthy ones."""
    slow_low: float = 1.2
    slow_high: float = 3.0
    """Their slowdowns, log-uniform over [slow_low, slow_high]."""
    device_spread: float = 0.0
    """Lognormal sigma of every device's own lasting speed (silicon and cooling differ a little)."""
    time_noise: float = 0.0
    """Lognormal sigma of each (scan, case)'s measured time around the device's speed."""

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError("devices must be >= 1")
        if not 0 <= self.defective_share <= 1:
            raise ValueError("defective_share must be in [0, 1]")
        if not 0 < self.p_low <= self.p_high < 1:
            raise ValueError("need 0 < p_low <= p_high < 1")
        if not 0 <= self.transient_rate < 1:
            raise ValueError("transient_rate must be in [0, 1)")
        if not 0 <= self.shared_defect_devices <= self.devices // 2 or not 0 < self.shared_defect_p <= 1:
            raise ValueError("shared_defect_devices must be in [0, devices/2], shared_defect_p in (0, 1]")

    def failure_probabilities(self) -> np.ndarray:
        """Per-device probability of a *reproducible* failure per execution (0 for healthy devices)."""
        rng = np.random.default_rng([self.seed, 1])
        n_bad = int(round(self.devices * self.defective_share))
        p = np.zeros(self.devices)
        bad = rng.choice(self.devices, size=n_bad, replace=False)
        p[bad] = np.exp(rng.uniform(math.log(self.p_low), math.log(self.p_high), size=n_bad))
        p[self.shared_batch()] = 0.0  # the batch's defect is its own
        return p

    def speeds(self) -> tuple[np.ndarray, set[int]]:
        """Per-device time factor (1: nominal: its lasting spread, times its slowdown for a slow device) and the slow
        devices. Drawn from a stream of its own, so a fleet's failures do not depend on these settings."""
        rng = np.random.default_rng([self.seed, 3])
        speed = np.exp(rng.normal(0.0, self.device_spread, size=self.devices))
        candidates = np.setdiff1d(np.flatnonzero(self.failure_probabilities() == 0), self.shared_batch())
        slow = rng.choice(candidates, size=self.slow_devices, replace=False)
        speed[slow] *= np.exp(rng.uniform(math.log(self.slow_low), math.log(self.slow_high), size=self.slow_devices))
        return speed, {int(n) for n in slow}

    def shared_batch(self) -> list[int]:
        """The devices of the batch, from the fleet's last hosts: a quarter of the batch's hosts hold two of it
        (installed together), the others one."""
        k, per = self.shared_defect_devices, self.devices_per_host
        pairs = k // 4 if per >= 2 else 0
        hosts = list(range(self.devices // per - 1, -1, -1))
        if len(hosts) < k - pairs:
            raise ValueError(f"a batch of {k} devices needs {k - pairs} hosts, the fleet has {len(hosts)}")
        out = [h * per + j for h in hosts[:pairs] for j in (0, 1)]
        out += [h * per for h in hosts[pairs : k - pairs]]
        return sorted(out)

    def host(self, n: int) -> str:
        return f"simhost{n // self.devices_per_host:05d}"


@dataclass
class SimDay:
    """What the policies did on one day."""

    day: int
    quarantined: list[str] = field(default_factory=list)
    """By the node policies and the fleet policy together."""
    by_node: list[str] = field(default_factory=list)
    breaker_tripped: bool = False
    reasons: list[str] = field(default_factory=list)
    failures: int = 0
    executions: int = 0
    slow: list[str] = field(default_factory=list)
    """Devices the fleet policy found newly slow that day."""


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _failure(dev: str, case: SimCase, t: float, digest: str, element: int) -> CaseResult:
    return CaseResult(
        device=dev,
        case=case.id,
        family=case.family,
        seed=case.seed,
        passed=False,
        duration_s=case.seconds,
        started_at=t,
        output_digest=digest,
        mismatches=1,
        element=element,
        expected="0x3f800000",
        actual="0x3f800001",
        xor_mask="0x00000001",
        location=f"sim:{dev}",
    )


@functools.lru_cache(maxsize=1024)
def _golden_digest(case_id: str) -> str:
    return _digest("golden", case_id)


@functools.lru_cache(maxsize=256)
def _plan(cases: tuple[SimCase, ...], past: tuple[tuple[str, int], ...]) -> list[SimCase]:
    return order_cases(cases, dict(past))


def _retests(
    dev: str,
    case: SimCase,
    at: float,
    digest: str,
    golden: str,
    retests: int,
    again_p: float,
    rng: np.random.Generator,
    fails: list[CaseResult],
) -> list[CaseResult]:
    """The retests of a failing case (``fails[0]`` is marked sticky when one fails again): a transient does not come
    back; a faulty unit (or a wrong golden) fails again with its probability."""
    again = int(rng.binomial(retests, again_p)) if again_p else 0
    fails[0] = dataclasses.replace(fails[0], sticky=again > 0)
    out = []
    for a in range(1, retests + 1):
        if a <= again:
            wrong = _failure(dev, case, at, digest or _digest(dev, case.id, "retest", a), 0)
            out.append(dataclasses.replace(wrong, attempt=a))
        else:
            out.append(
                CaseResult(
                    device=dev,
                    case=case.id,
                    family=case.family,
                    seed=case.seed,
                    passed=True,
                    duration_s=case.seconds,
                    started_at=at,
                    attempt=a,
                    output_digest=golden,
                )
            )
    return out


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
    shared: tuple[str, float] | None = None,
    speed: float = 1.0,
    noise: np.ndarray | None = None,
) -> tuple[int, int, set[str]]:
    """One day's scan of one simulated device through the store; (executions, failures, failing families).

    ``bad_case``: the bad golden file's case. ``shared``: ``(case, p)`` of a defect this device shares with its
    batch (the same wrong output on each of them). ``speed`` scales the device time recorded per execution, and
    ``noise`` (one factor per case of the plan) each case's; the count of executions stays the nominal one.
    """
    plan = _plan(tuple(cases), tuple(sorted(past_failures.items())))
    # As the real budget loop: cycles of the plan while the next case fits (the final flush reserve kept free).
    total = int((budget_s - 0.05) / (sum(c.seconds for c in plan) / len(plan)))
    base, extra = divmod(total, len(plan))
    scan_id = store.scans.begin(device=dev, host=host, budget_s=budget_s, meta={"sim": True}, started_at=t)
    results: list[CaseResult] = []
    executions = failures = 0
    failing_families: set[str] = set()
    p = min(1.0, p_fault + transient_rate)
    for i, case in enumerate(plan):
        n = base + (i < extra)
        if n == 0:
            continue
        at = t + budget_s * i / len(plan)
        golden = _golden_digest(case.id)  # the output the case passes with
        shared_p = shared[1] if shared is not None and shared[0] == case.id else 0.0
        again_p = p_fault
        if case.id == bad_case:
            k, digest = n, golden  # every device computes the right answer; the bad file says it is wrong
            again_p = 1.0
        elif shared_p:
            k, digest = int(rng.binomial(n, min(1.0, p + shared_p))), _golden_digest(f"batch|{case.id}")
            again_p = shared_p
        else:
            k, digest = int(rng.binomial(n, p)), ""
        executions += n
        if n - k:
            results.append(
                CaseResult(
                    device=dev,
                    case=case.id,
                    family=case.family,
                    seed=case.seed,
                    passed=True,
                    duration_s=(n - k) * case.seconds * speed * (1.0 if noise is None else float(noise[i])),
                    started_at=at,
                    executions=n - k,
                    last_started_at=at + (n - 1) * case.seconds,
                    output_digest=golden,
                )
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
            fails += _retests(dev, case, at, digest, golden, retests, again_p, rng, fails)
        results.extend(fails)
    store.scans.record(scan_id, results, finish="complete", finished_at=t + budget_s, total=None)
    return executions, failures, failing_families


class SimRun:
    """A fleet scanned day by day into per-node stores, merged into a fleet store, with both policies.

    :meth:`fork` continues the same history in a copy of every store.
    """

    def __init__(
        self,
        directory: Path,
        fleet: SimFleet,
        policy: Any,
        *,
        budget_s: float = DEFAULT_BUDGET_S,
        retests: int = DEFAULT_RETESTS,
        cases: Sequence[SimCase] = DEFAULT_CASES,
        start: float = 1_767_225_600.0,
    ) -> None:
        from sdcguard.fleet.store.store import Store

        self.directory = Path(directory)
        (self.directory / "nodes").mkdir(parents=True, exist_ok=True)
        self.fleet = fleet
        self.policy = policy
        self.budget_s = budget_s
        self.retests = retests
        self.cases = tuple(cases)
        self.start = start
        self.p = fleet.failure_probabilities()
        self.batch = set(fleet.shared_batch())
        self.shared_case = self.cases[len(self.cases) // 3].id
        self.rng = np.random.default_rng([fleet.seed, 2])
        self.speeds, self.slow = fleet.speeds()
        self.time_rng = np.random.default_rng([fleet.seed, 4])
        self.slow_on: dict[str, int] = {}
        """Device -> the first day the fleet policy found it slow."""
        self.ids = [sim_id(n) for n in range(fleet.devices)]
        self.hosts: dict[str, list[int]] = {}
        for n in range(fleet.devices):
            self.hosts.setdefault(fleet.host(n), []).append(n)
        self.quarantined_on: dict[str, int] = {}
        self.past: dict[str, dict[str, int]] = {}
        self.log: list[SimDay] = []
        for host, members in self.hosts.items():
            with Store.open(self.node_store(host)) as node:
                node.scans.record_devices(
                    [DeviceInfo(id=self.ids[n], host=host, kind="sim", model="simulated") for n in members], now=start
                )

    @property
    def fleet_store(self) -> Path:
        return self.directory / "fleet.db"

    def node_store(self, host: str) -> Path:
        return self.directory / "nodes" / f"{host}.db"

    def day(self, day: int, *, bad_case: str | None = None) -> SimDay:
        """Scan every device not quarantined, each node applies its policy, the fleet merges and applies its own
        (``bad_case``: the bad golden file of that day)."""
        from sdcguard.fleet.merge import merge_stores
        from sdcguard.fleet.policy import apply_policy
        from sdcguard.fleet.store.store import Store

        t_day = self.start + day * DAY_S
        today = SimDay(day=day)
        for host, members in self.hosts.items():
            scanned = []
            with Store.open(self.node_store(host)) as node:
                for n in members:
                    dev = self.ids[n]
                    if dev in self.quarantined_on:
                        continue
                    ex, fa, fams = scan_sim_device(
                        node,
                        dev=dev,
                        host=host,
                        p_fault=float(self.p[n]),
                        transient_rate=self.fleet.transient_rate,
                        t=t_day + 60.0 * (n % 60),
                        cases=self.cases,
                        past_failures=self.past.get(dev, {}),
                        budget_s=self.budget_s,
                        retests=self.retests,
                        rng=self.rng,
                        bad_case=bad_case,
                        shared=(self.shared_case, self.fleet.shared_defect_p) if n in self.batch else None,
                        speed=float(self.speeds[n]),
                        noise=np.exp(self.time_rng.normal(0.0, self.fleet.time_noise, size=len(self.cases)))
                        if self.fleet.time_noise
                        else None,
                    )
                    scanned.append(dev)
                    today.executions += ex
                    today.failures += fa
                    for f in fams:
                        self.past.setdefault(dev, {})[f] = self.past.get(dev, {}).get(f, 0) + 1
                if scanned:
                    out = apply_policy(node, self.policy, devices=scanned, now=t_day + 3600.0, scope="node")
                    today.by_node += out.quarantined
        merge_stores(self.fleet_store, [self.node_store(h) for h in self.hosts])
        with Store.open(self.fleet_store) as fleet:
            outcome = apply_policy(fleet, self.policy, now=t_day + 7200.0, scope="fleet")
        today.quarantined = sorted({*today.by_node, *outcome.quarantined})
        today.breaker_tripped = outcome.breaker_tripped
        today.slow = list(outcome.slow)
        for dev in outcome.slow:
            self.slow_on.setdefault(dev, day)
        today.reasons = [r for r in outcome.reasons if "breaker" in r][:3]
        for dev in today.quarantined:
            self.quarantined_on.setdefault(dev, day)
        self.log.append(today)
        return today

    def fork(self, directory: Path) -> SimRun:
        """The same fleet, history and random state, continuing in a copy of every store at ``directory``."""
        import shutil

        shutil.copytree(self.directory, directory)
        other = copy.copy(self)
        other.directory = Path(directory)
        other.rng = copy.deepcopy(self.rng)
        other.quarantined_on = dict(self.quarantined_on)
        other.past = copy.deepcopy(self.past)
        other.log = list(self.log)
        other.time_rng = copy.deepcopy(self.time_rng)
        other.slow_on = dict(self.slow_on)
        return other
