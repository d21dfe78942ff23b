"""Verified recovery against today's exit and restart, side by side in one run on the same job (gloo ranks on this
machine), and a goodput model for a 16,384-device fleet built from the measured figures.

The job: a small transformer, ``--workers`` data-parallel ranks, the guard at its defaults except
``replay_every=--every`` (a sample every few steps, so the drill is short), a sticky fault on worker 1 from step
``--fault``. For each way of going on after the verdict, the steps lost (from the state the job went on from to the
step of the verdict) and the seconds from the verdict (the incident's time) to the next committed step:

- ``recover, spare``: ``escalate="recover"`` with one dedicated shadow, promoted in place of worker 1;
- ``recover, no spare``: the survivors go on as a smaller job (``min_replicas``);
- ``restart, shared memory``: every rank exits by the contract, a new job (new processes) goes on from the verified
  snapshot that survived in shared memory (``snapshot_dir``, ``guard.restore``);
- ``exit + DCP restart``: today's path: every rank exits, a new job loads the last verified DCP checkpoint, saved
  in this short run a few steps before the fault; the model takes Young's interval, sqrt(2 x save time x mean time
  between interruptions), the interval the planning model recommends.

Then the snapshot's cost at the defaults (``replay_every=50``: a snapshot after every sampled step): one copy and
fingerprint of the job's whole state, timed, times the share of steps that take one, against the step's own time.
And the goodput model: ``--devices`` devices whose per-device interruption rates are drawn from a seeded fleet (most
devices at a base rate, one in 1,000 ten times as often) and counted over a simulated year, so the job is
interrupted every ``1/lambda`` seconds (the issue's 16,384-GPU job: every ~1.8 h); the planning model's formulas
(:mod:`sdcguard.fleet.plan.intervals`) at a step of ``--step-at-scale`` and a save of ``--save-at-scale`` seconds,
a restart at scale set so that today's path gives Gemini's 85% (the anchor)::

    python benchmarks/recovery.py                 # about a minute here
    python benchmarks/recovery.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _model(width: int) -> tuple[Any, Any]:
    import torch

    from sdcguard.testing.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(d=width, heads=4, seq=16, layers=2)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _batch(step: int, data_rank: int) -> Any:
    import torch

    from sdcguard.testing.models import make_batch

    torch.manual_seed(1000 * step + data_rank)
    return make_batch(step, data_rank, batch=8, seq=16)


def drill(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """One way of going on: the guarded loop with the sticky fault; on a restart, the new job's loop. A rank that
    leaves by the contract returns its status."""
    saves: list[float] = []
    try:
        return _drill(rank, cfg, saves)
    except SystemExit as e:
        return {"exit": e.code, "save_s": saves}


def _drill(rank: int, cfg: dict[str, Any], saves: list[float]) -> dict[str, Any]:
    import contextlib

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard import SDCGuard, checkpoint, plan_roles
    from sdcguard.inject.faults import Fault
    from sdcguard.inject.torch_faults import OpFaultMode
    from sdcguard.testing.models import lm_loss

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ["SDCGUARD_VERDICT_FILE"] = os.path.join(cfg["out"], f"rank{rank}.jsonl")
    roles = plan_roles(1) if cfg["spare"] else None
    model, opt = _model(cfg["width"])
    guard = SDCGuard(
        model if roles is not None and roles.role == "shadow" else DDP(model, process_group=roles and roles.dp_group),
        lm_loss,
        group=roles.dp_group if roles else None,
        shadows=list(roles.shadows) if roles else "peer",
        replay_every=cfg["every"],
        slow=None,
        optimizer=opt,
        escalate="recover",
        min_replicas=cfg["min_replicas"],
        snapshot_dir=cfg["shm"],
    )
    step, start = 0, None
    if cfg["restart"]:

        def from_disk() -> int:
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            msd, osd = get_state_dict(model, opt)
            info = checkpoint.load({"m": msd, "o": osd}, checkpoint_id=cfg["disk"], fallback=True)
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            return (info.step or 0) + 1

        restored = guard.restore(fallback=from_disk)
        step, start = restored.step or 0, restored.step
    elif roles is not None and roles.role == "shadow":
        guard.serve()
        if guard.role != "worker":
            return {}
        step = guard.resume_from or 0
    fault = (
        OpFaultMode(
            Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5),
            ops="gelu",
            phase="forward",
            rank=1,
            steps=range(cfg["fault"], 10**6),
        )
        if rank == 1 and not cfg["restart"]
        else None
    )
    times: list[float] = []
    committed_at, resumed = None, None
    while step < cfg["steps"]:
        if fault is not None:
            fault.step = step
        t0 = time.perf_counter()
        with fault if fault is not None else contextlib.nullcontext():
            report = guard.step(step, _batch(step, guard.data_rank))
        if report.resume_from is not None:
            resumed, step = report.resume_from, report.resume_from
            continue
        if report.commit:
            opt.step()
            if committed_at is None and (resumed is not None or start is not None or guard.resume_from is not None):
                committed_at = time.time()
        opt.zero_grad(set_to_none=True)
        guard.after_optimizer_step()
        times.append(time.perf_counter() - t0)
        if cfg["save_every"] and step and step % cfg["save_every"] == 0:  # after a sampled step: a verified state
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(model, opt)
            t1 = time.perf_counter()
            checkpoint.save({"m": msd, "o": osd}, checkpoint_id=f"{cfg['disk']}/{step}", guard=guard)
            saves.append(time.perf_counter() - t1)
        step += 1
    guard.close()
    told = [i for i in guard.incidents if i.recovered_step is not None]
    return {
        "committed_at": committed_at,
        "restored_from": start,
        "step_s": times,
        "save_s": saves,
        "recovered": [(i.step, i.recovered_step, i.time) for i in told],
    }


def snapshot_cost(width: int, reps: int) -> dict[str, float]:
    """One snapshot of the job's state (copy and fingerprint), timed, against one plain step of the job."""
    import torch

    from sdcguard.testing.models import lm_loss
    from sdcguard.training.recovery.snapshot import SnapshotKeeper
    from sdcguard.training.recovery.state import LiveState

    torch.set_num_threads(1)
    model, opt = _model(width)
    lm_loss(model, _batch(0, 0)).backward()
    opt.step()
    keeper = SnapshotKeeper(LiveState(model, opt))
    snaps, steps = [], []
    for i in range(reps):
        t0 = time.perf_counter()
        keeper.take(i, "pending")
        snaps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        opt.zero_grad()
        lm_loss(model, _batch(i, 0)).backward()
        opt.step()
        steps.append(time.perf_counter() - t0)
    snaps.sort()
    steps.sort()
    share = 1 / 50  # a snapshot after every sampled step: replay_every=50
    return {
        "snapshot_s": snaps[len(snaps) // 2],
        "step_s": steps[len(steps) // 2],
        "share": share,
        "bytes": sum(t.numel() * t.element_size() for t in keeper.live.read()[1]),
    }


def fleet_rate(devices: int, seed: int, mtbi_h: float) -> tuple[float, int]:
    """Interruptions per second of a job on ``devices`` devices: per-device rates drawn from a seeded fleet (one
    device in 1,000 ten times the base rate, the base set so the job's mean time between interruptions is
    ``mtbi_h`` hours), then events counted over a simulated year (the measured rate, and the events)."""
    rng = random.Random(seed)
    weights = [10.0 if rng.random() < 0.001 else 1.0 for _ in range(devices)]
    base = 1 / (mtbi_h * 3600 * sum(weights))
    year = 365 * 86400.0
    events = 0
    for w in weights:  # Poisson counts per device: exponential gaps until the year is over
        t = rng.expovariate(w * base)
        while t < year:
            events += 1
            t += rng.expovariate(w * base)
    return events / year, events


def _model_fleet(
    a: argparse.Namespace, rows: dict[str, dict[str, float]], rate: float, snapshot: float
) -> dict[str, Any]:
    """The goodput of each way at scale, with the planning model's formulas (:mod:`sdcguard.fleet.plan.intervals`,
    docs/plan.md): today's path checkpoints at Young's interval and restarts from the checkpoint at every
    interruption (Daly's exact goodput), the restart's time set so that it gives 85% (Gemini's figure, the anchor);
    the others keep the same checkpoints (for what they cannot recover from) and take every interruption of the
    model in their own way: in place (the measured lost steps and seconds) or by a restart from the snapshot (the
    measured lost steps and the same restart), the snapshot's share of each step on top."""
    from sdcguard.fleet.plan.intervals import RecoveryCost, goodput, goodput_with_recovery, young

    step, save, mtbf = a.step_at_scale, a.save_at_scale, 1 / rate
    interval = young(save, mtbf)
    lo, hi = 0.0, mtbf  # the restart that makes today's path give 85%, by bisection (goodput falls as it grows)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if goodput(interval, save, mid, mtbf) > 0.85 else (lo, mid)
    restart = (lo + hi) / 2
    out: dict[str, Any] = {"interval_s": interval, "restart_s": restart, "checkpoint_share": save / (interval + save)}
    out["exit + DCP restart"] = goodput(interval, save, restart, mtbf)
    ways = {
        "restart, shared memory": (rows["restart, shared memory"]["lost"] * step, restart),
        "recover, no spare": (rows["recover, no spare"]["lost"] * step, rows["recover, no spare"]["seconds"]),
        "recover, spare": (rows["recover, spare"]["lost"] * step, rows["recover, spare"]["seconds"]),
    }
    for name, (lost, seconds) in ways.items():
        cost = RecoveryCost(lost_s=lost, recovery_s=seconds)
        kept = goodput_with_recovery(interval, save, restart, loud_per_s=0.0, recoverable_per_s=rate, cost=cost)
        out[name] = kept * (1 - snapshot)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--every", type=int, default=4, help="replay_every of the drills")
    p.add_argument("--fault", type=int, default=13, help="the step the sticky fault starts at")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--devices", type=int, default=16384)
    p.add_argument("--mtbi-hours", type=float, default=1.8, help="the job's mean time between interruptions")
    p.add_argument("--reps", type=int, default=30, help="snapshots timed")
    p.add_argument("--step-at-scale", type=float, default=2.0, help="the model's step at scale, seconds")
    p.add_argument("--save-at-scale", type=float, default=60.0, help="a DCP save at scale, seconds")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if a.workers < 3 or not 0 < a.fault < a.steps:
        print(
            "recovery.py: --workers must be >= 3 (two peers cannot tell which is faulty) and 0 < --fault < --steps",
            file=sys.stderr,
        )
        return 2
    from sdcguard.testing import run_ranks

    tmp = Path(tempfile.mkdtemp(prefix="sdcguard-recovery-bench-"))
    rate, events = fleet_rate(a.devices, 0, a.mtbi_hours)
    cost = snapshot_cost(a.width, a.reps)
    rows: dict[str, dict[str, float]] = {}
    try:
        base = {"width": a.width, "every": a.every, "fault": a.fault, "steps": a.steps, "save_every": 0}

        def run(name: str, world: int, **cfg: Any) -> list[dict[str, Any]]:
            out = tmp / name
            out.mkdir(exist_ok=True)
            c = {
                **base,
                "out": str(out),
                "shm": None,
                "disk": str(tmp / "disk" / name),
                "spare": False,
                "min_replicas": None,
                "restart": False,
                **cfg,
            }
            return run_ranks(drill, world, c, timeout=600)

        def verdict(name: str) -> tuple[int, float]:
            first = json.loads((tmp / name / "rank1.jsonl").read_text().splitlines()[0])
            return first["incidents"][0]["step"], first["incidents"][0]["time"]

        for name, world, cfg in [
            ("recover, spare", a.workers + 1, {"spare": True}),
            ("recover, no spare", a.workers, {"min_replicas": a.workers - 1}),
        ]:
            results = run(name, world, **cfg)
            at, resume, t_verdict = results[0]["recovered"][0]
            rows[name] = {
                "lost": at - resume + 1,
                "seconds": results[0]["committed_at"] - t_verdict,
                "step_s": _median(results[0]["step_s"]),
            }
        step_s, save_s = rows["recover, no spare"]["step_s"], float("nan")
        # Today's path saves a verified DCP checkpoint; in this short run one is saved a few steps before the fault
        # (the run's lost steps); the model takes Young's interval.
        run_every = a.every * max(1, (a.fault - 1) // a.every)
        for name, shm, every in [
            ("restart, shared memory", str(tmp / "shm"), 0),
            ("exit + DCP restart", None, run_every),
        ]:
            first = run(name, a.workers, shm=shm, save_every=every, steps=a.steps)
            saves = [t for r in first for t in r.get("save_s", [])]
            save_s = _median(saves) if saves else save_s
            at, t_verdict = verdict(name)
            again = run(name, a.workers, shm=shm, restart=True, fault=10**6)
            rows[name] = {
                "lost": at - again[0]["restored_from"] + 1,
                "seconds": again[0]["committed_at"] - t_verdict,
                "step_s": step_s,
            }
        snapshot_share = cost["snapshot_s"] * cost["share"] / cost["step_s"]
        model = _model_fleet(a, rows, rate, snapshot_share)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print(a, rows, cost, snapshot_share, save_s, run_every, events, rate, model)
    if a.json is not None:
        report = {"rows": rows, "snapshot": cost, "snapshot_share": snapshot_share, "save_s": save_s, "rate": rate}
        a.json.write_text(json.dumps({**report, "goodput": model}, indent=1))
    return 0


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if v else float("nan")


def _print(
    a: argparse.Namespace,
    rows: dict[str, dict[str, float]],
    cost: dict[str, float],
    share: float,
    save_s: float,
    run_every: int,
    events: int,
    rate: float,
    model: dict[str, Any],
) -> None:
    step_ms = rows["recover, no spare"]["step_s"] * 1e3
    print(
        f"job: {a.workers} workers, width {a.width}, replay_every={a.every}, sticky fault on worker 1 from step "
        f"{a.fault}; a step {step_ms:.1f} ms; a DCP save {save_s * 1e3:.1f} ms, every {run_every} steps in this run"
    )
    print(f"{'way of going on':<24} {'steps lost':>10} {'s to next commit':>17}")
    for name, r in rows.items():
        print(f"{name:<24} {r['lost']:>10.0f} {r['seconds']:>17.3f}")
    print(
        f"snapshot at the defaults: {cost['bytes'] / 1e6:.2f} MB copied and fingerprinted in "
        f"{cost['snapshot_s'] * 1e3:.2f} ms after {cost['share']:.0%} of the steps, a step "
        f"{cost['step_s'] * 1e3:.1f} ms: {share:.2%} of a step (goal <= 1%)"
    )
    print(
        f"fleet: {a.devices} devices, {events} interruptions in a simulated year: one every {1 / rate / 3600:.2f} h; "
        f"at scale a step {a.step_at_scale:g} s, a DCP save {a.save_at_scale:g} s, checkpoint every "
        f"{model['interval_s'] / 60:.1f} min (Young's, {model['checkpoint_share']:.1%} of the time), a restart "
        f"{model['restart_s']:.0f} s (today's path at 85%)"
    )
    for name in rows:
        print(f"goodput, {name:<24} {model[name]:.1%}")


if __name__ == "__main__":
    raise SystemExit(main())
