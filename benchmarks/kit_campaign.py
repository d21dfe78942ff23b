"""lm-resiliency 0.2.0's fault kit, every fault it injects on CPU, against the guard and against the kit's own SCOUT
detector on the same runs over gloo (DDP), each detector's verdicts scored by the kit's own scorer. Not run in CI;
lm-resiliency is not a dependency (``pip install lm-resiliency==0.2.0`` into a virtual environment first).

    python benchmarks/kit_campaign.py [defaults | REPLAY_EVERY] [WORLD] [SURFACES] [MICRO_BATCHES]

SURFACES is a comma-separated subset of output, input, weight, gradient, optimizer_state (default: all). Every
fault the kit's local executor injects there (``tensor_corruption`` by single and multi bit flip, set value, scale,
noise and sign flip; ``stale_state``; ``duplicate``; on the flow surfaces, input, output and gradient, also
``drop`` and ``reorder``), one-off and sticky (three iterations), on ``blocks.0.fc1`` of rank 1 of a tiny
transformer under DDP: its output, its input, its weight, the weight's gradient, the weight's SGD momentum buffer.
One-off is one matching call; on weight and optimizer state, which the kit mutates for whole iterations, one
iteration. The flow faults run in one job, five steps apart (a vetoed or all-reduced flow fault leaves the replicas
equal); each state fault in a job of its own (it can leave the replicas apart until caught), onset at step 2, run
to step 105 at the defaults (past both detectors' replays of steps 50 and 100 and the guard's weight check at 100),
8 steps past the onset otherwise.

The guard is built first (``escalate="off"``, ``slow=None``), then SCOUT (``ModelReplayHarness`` on the model's one
block, its check in an optimizer post-step hook every ``REPLAY_EVERY`` steps, 50 for ``defaults`` as the guard's
replay; its embedding recipe off, as it finds no embedding under the names it knows, and its temporal straggler
baseline off), then the kit (``enable_fault_injection``), whose hooks therefore run after both detectors'. The guard
is handed the step counted from 1, as SCOUT and the kit count it, so at the defaults both replay the same training
steps. The kit's iteration is the optimizer step, called on vetoed steps too (their gradients are None: the weights
do not move).

An occurrence's window runs from its onset step to the next onset (or the job's end). Each detector's verdicts in it
(the guard's incidents; SCOUT's ``kind="sdc"`` reports) make one ``LocalizationResult``, scored by
``FaultInjectionSession.evaluate``; a verdict before the first onset is an alarm on a clean step. Prints one line per
fault kind and timing, the totals, and the rows as JSON."""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from sdcguard import SDCGuard  # noqa: E402
from sdcguard.testing import run_ranks  # noqa: E402
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch  # noqa: E402

SEQ = 4
FAULTY = 1
SPACING = 5
STICKY = 3
MODULE = "blocks.0.fc1"
SURFACES = ("output", "input", "weight", "gradient", "optimizer_state")
STATE = ("weight", "optimizer_state")
FLOW = ("output", "input", "gradient")  # the kit's drop and reorder act on values that flow, not on state
KINDS: list[tuple[str, dict[str, Any]]] = [
    ("tensor_corruption", {"operation": "single_bitflip"}),
    ("tensor_corruption", {"operation": "multi_bitflip"}),
    ("tensor_corruption", {"operation": "set_value", "value": 7.0}),
    ("tensor_corruption", {"operation": "scale", "factor": 2.0}),
    ("tensor_corruption", {"operation": "noise"}),
    ("tensor_corruption", {"operation": "sign_flip"}),
    ("stale_state", {}),
    ("duplicate", {}),
    ("drop", {}),
    ("reorder", {}),
]


def _kind_name(kind: str, params: dict[str, Any]) -> str:
    return params.get("operation", kind)


def _name(surface: str, kind: str, timing: str, params: dict[str, Any]) -> str:
    return f"{surface}-{_kind_name(kind, params)}-{timing}"


def _selectors(surface: str) -> dict[str, Any]:
    if surface in ("input", "output"):
        return {}
    if surface == "optimizer_state":
        return {"parameter": "weight", "state_key": "momentum_buffer"}
    return {"parameter": "weight"}


def plan(surfaces: tuple[str, ...]) -> tuple[list[tuple[str, str, str, dict[str, Any]]], list[tuple[str, str]]]:
    """The (surface, kind, timing, parameters) cases the kit injects, and the (surface, kind) pairs it cannot."""
    cases, skipped = [], []
    for surface in surfaces:
        for kind, params in KINDS:
            if kind in ("drop", "reorder") and surface not in FLOW:
                skipped.append((surface, _kind_name(kind, params)))
                continue
            for timing in ("oneoff", "sticky"):
                cases.append((surface, kind, timing, params))
    return cases, skipped


def _campaign(cases: list[tuple[str, str, str, dict[str, Any]]], tail: int) -> tuple[Any, int]:
    from lm_resiliency.fault_injection import (
        FailureType,
        FaultCampaign,
        FaultIncident,
        FaultSpec,
        FaultSurface,
        FaultTarget,
        IncidentLifetime,
        IncidentTrigger,
    )

    incidents = []
    at = 3
    for surface, kind, timing, params in cases:
        name = _name(surface, kind, timing, params)
        if timing == "sticky":
            lifetime = IncidentLifetime(iterations=STICKY)
        elif surface in STATE:  # the kit's state faults last whole iterations: one is its one-off
            lifetime = IncidentLifetime(iterations=1)
        else:
            lifetime = IncidentLifetime(matching_calls=1)
        target = FaultTarget(surface=FaultSurface(surface), rank=FAULTY, module_path=MODULE)
        spec = FaultSpec(
            fault_id=name, type=FailureType(kind), target=target, parameters={**params, **_selectors(surface)}
        )
        incidents.append(
            FaultIncident(incident_id=name, trigger=IncidentTrigger(at=(at,)), lifetime=lifetime, faults=(spec,))
        )
        at += SPACING
    return FaultCampaign(name="sdcguard-kit-campaign", incidents=tuple(incidents), seed=0), at - SPACING + tail


class _CpuEvent:
    """A stand-in for ``torch.cuda.Event`` on a machine without CUDA: wall-clock time at ``record``."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: _CpuEvent) -> float:
        return (end.at - self.at) * 1000.0


def _cuda_stand_ins() -> None:
    """SCOUT's replay is written for CUDA: it calls ``torch.cuda.synchronize`` and times with ``torch.cuda.Event``
    whatever its device (``lm_resiliency/detection/layer_replay.py``). Without CUDA these become a no-op and a
    wall-clock event, in this rank's process only; they time the replay (its straggler check), its SDC verdict
    compares values."""
    if torch.cuda.is_available():
        return
    stand_ins = {
        "synchronize": lambda device=None: None,
        "Event": _CpuEvent,
        "current_stream": lambda device=None: None,
    }
    for name, stand_in in stand_ins.items():
        setattr(torch.cuda, name, stand_in)


def _scout(model: TinyTransformer, opt: torch.optim.Optimizer, every: int, now: list[int]) -> tuple[Any, list[Any]]:
    """SCOUT's replay harness on the model's one block; its SDC reports as (step, failed ranks, scope)."""
    from lm_resiliency.detection import ModelReplayHarness, ReplayHarnessConfig, replay_fault_reports

    seen: list[tuple[int, tuple[int, ...], str]] = []

    def on_fault(result: Any) -> None:
        for r in replay_fault_reports(result):
            if r.get("kind") == "sdc":
                seen.append((now[0], tuple(r.get("failed_ranks", ())), str(r.get("scope"))))

    _cuda_stand_ins()
    config = ReplayHarnessConfig(check_interval=every, enable_temporal=False, embedding_check_interval=0)
    me = multiprocessing.current_process()
    me.daemon = False  # SCOUT's hang detector starts a process of its own, which a daemonic rank may not
    try:
        harness = ModelReplayHarness(
            model, optimizer=opt, device=torch.device("cpu"), config=config, layers=model.blocks, callback=on_fault
        )
    finally:
        me.daemon = True
    return harness, seen


def _windows(records: list[Any], steps: int) -> dict[str, tuple[int, int]]:
    onsets: dict[str, int] = {}
    for r in records:
        onsets[r.occurrence_id] = min(onsets.get(r.occurrence_id, steps), r.iteration - 1)  # the kit counts from 1
    ordered = sorted(onsets.items(), key=lambda kv: kv[1])
    return {o: (s, ordered[i + 1][1] if i + 1 < len(ordered) else steps) for i, (o, s) in enumerate(ordered)}


def _score(session: Any, windows: dict[str, tuple[int, int]], found: list[tuple[int, tuple[int, ...], str]]) -> Any:
    """One LocalizationResult per occurrence from the verdicts in its window, scored by the kit's scorer."""
    results: list[dict[str, Any]] = []
    for occurrence, (start, end) in windows.items():
        seen = [f for f in found if start <= f[0] < end]
        results.append(
            {
                "occurrence_id": occurrence,
                "detected": bool(seen),
                "failed_ranks": sorted({r for f in seen for r in f[1]}),
                "kind": "sdc" if seen else None,
                "scope": seen[0][2] if seen else None,
                "metadata": {"steps_to_detection": seen[0][0] - start if seen else None},
            }
        )
    report = session.evaluate(results)
    by_id = {r["occurrence_id"]: r for r in results}
    return {e.occurrence_id: (e, by_id[e.occurrence_id]["metadata"]["steps_to_detection"]) for e in report.evaluations}


def _alarms(windows: dict[str, tuple[int, int]], found: list[tuple[int, tuple[int, ...], str]]) -> list[int]:
    return sorted({f[0] for f in found if not any(s <= f[0] < e for s, e in windows.values())})


def job(rank: int, world: int, every: int | None, cases: list[Any], micro: int, tail: int) -> dict[str, Any]:
    from lm_resiliency.fault_injection import enable_fault_injection

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    guard = SDCGuard(DDP(model), lm_loss, replay_every=every, escalate="off", slow=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    now = [0]
    harness, scout_found = _scout(model, opt, 50 if every is None else every, now)
    campaign, steps = _campaign(cases, tail)
    session = enable_fault_injection(model, opt, campaign=campaign)  # its hooks after the guard's and SCOUT's
    torch.manual_seed(100 + rank)
    found: list[tuple[int, tuple[int, ...], str]] = []
    kinds: dict[int, set[str]] = {}
    commits = []
    aborted = None
    for step in range(steps):
        now[0] = step
        batches = [make_batch(step, rank * micro + i, seq=SEQ) for i in range(micro)]
        report = guard.step(step + 1, micro_batches=batches)  # counted from 1, as the kit and SCOUT count
        commits.append(report.commit)
        incidents = list(report.incidents)
        try:
            opt.step()  # a vetoed step's gradients are None: the kit's iteration and SCOUT's check still run
        except RuntimeError as e:  # the kit's iteration preflight fails on every rank at once, then closes
            aborted = {"step": step, "error": str(e)}
            break
        opt.zero_grad(set_to_none=True)
        incidents += guard.after_optimizer_step()
        for i in incidents:
            found.append((i.step - 1, tuple(i.suspect_ranks), "rank"))
            kinds.setdefault(i.step - 1, set()).add(i.kind)
    guard.close()
    harness.remove_hooks()
    records = [r for r in session.records if r.execution_rank == rank]
    out: dict[str, Any] = {"rank": rank, "steps": steps, "aborted": aborted}
    if records:
        windows = _windows(records, steps)
        guard_eval = _score(session, windows, found)
        scout_eval = _score(session, windows, scout_found)
        rows = []
        for r in records:
            (g, g_steps), (s, s_steps) = guard_eval[r.occurrence_id], scout_eval[r.occurrence_id]
            start, end = windows[r.occurrence_id]
            active = range(start, start + (1 if r.incident_id.endswith("oneoff") else STICKY))
            rows.append(
                {
                    "incident": r.incident_id,
                    "onset": start,
                    "status": r.status.value,
                    "error": r.error,
                    "injected": g.injection_succeeded,
                    "guard": [g.detected, g.localized, list(g.reported_ranks), g_steps],
                    "vetoed": all(not commits[i] for i in active if i < len(commits)),
                    "guard_kinds": sorted({k for i in range(start, end) for k in kinds.get(i, ())}),
                    "scout": [s.detected, s.localized, list(s.reported_ranks), s_steps],
                }
            )
        out["rows"] = rows
        out["alarms"] = {"guard": _alarms(windows, found), "scout": _alarms(windows, scout_found)}
    session.close()
    return out


def _mark(detected: bool, localized: bool, named: list[int], steps: int | None) -> str:
    if not detected:
        return "-"
    return f"{'yes' if localized else 'named ' + str(named)} +{steps}"


def run(every: int | None, world: int, surfaces: tuple[str, ...], micro: int) -> dict[str, Any]:
    """The flow faults in one job, each state fault in a job of its own (the module docstring says why)."""
    cases = plan(surfaces)[0]
    flow = [c for c in cases if c[0] not in STATE]
    jobs = ([flow] if flow else []) + [[c] for c in cases if c[0] in STATE]
    tail = 8 if every is not None else 105 - 3
    out: dict[str, Any] = {"rows": [], "aborted": [], "alarms": {"guard": [], "scout": []}, "steps": 0}
    for group in jobs:
        res = run_ranks(job, world, every, group, micro, 2 if group is flow else tail, timeout=1800)[FAULTY]
        out["rows"] += res.get("rows", [])
        out["steps"] += res["steps"]
        if res["aborted"]:
            out["aborted"].append({**res["aborted"], "cases": [_name(*c) for c in group]})
        for who in ("guard", "scout"):
            out["alarms"][who] += [(group[0][0], step) for step in res.get("alarms", {}).get(who, [])]
    return out


def print_table(res: dict[str, Any], names: list[str], skipped: list[tuple[str, str]], title: str) -> None:
    rows = res["rows"]
    print(title)
    print(
        "fault (surface-kind-timing) | injected | guard: caught, steps | vetoed | guard checks | SCOUT: caught, steps"
    )
    for r in rows:
        status = "yes" if r["injected"] else f"no ({r['status']}: {(r['error'] or '')[:60]})"
        guard, scout = _mark(*r["guard"]), _mark(*r["scout"])
        print(" | ".join((r["incident"], status, guard, str(r["vetoed"]), ",".join(r["guard_kinds"]), scout)))
    ran = {r["incident"] for r in rows}
    for name in names:
        if name not in ran:
            print(f"{name} | not run: the kit stopped its job (below)")
    for surface, kind in skipped:
        print(f"{surface}-{kind} | not injectable: the kit's drop and reorder act on input, output and gradient only")
    for a in res["aborted"]:
        print(f"the kit stopped the job of {', '.join(a['cases'])} at step {a['step']}: {a['error']}")
    injected = [r for r in rows if r["injected"]]
    print(f"cases {len(names)}, run {len(rows)}, injected {len(injected)} (the kit's scorer), {res['steps']} steps")
    for who in ("guard", "scout"):
        det = sum(r[who][0] for r in injected)
        loc = sum(r[who][1] for r in injected)
        lag = [r[who][3] for r in injected if r[who][0]]
        extra = f", vetoed {sum(r['vetoed'] for r in injected)}" if who == "guard" else ""
        print(
            f"{who}: of the {len(injected)} injected, detected {det}, localized to rank {FAULTY} alone {loc}{extra}; "
            f"steps to detection {sorted(set(lag))}; alarms before any fault at {res['alarms'][who]}"
        )


if __name__ == "__main__":
    every = None if sys.argv[1] == "defaults" else int(sys.argv[1])
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    surfaces = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] != "all" else SURFACES
    micro = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    res = run(every, world, surfaces, micro)
    title = (
        f"lm-resiliency 0.2.0 campaign, {world} ranks, {micro} micro-batch(es), guard replay_every={sys.argv[1]}, "
        f"SCOUT check_interval={50 if every is None else every}"
    )
    cases, skipped = plan(surfaces)
    print_table(res, [_name(*c) for c in cases], skipped, title)
    print(json.dumps(res, default=str))
