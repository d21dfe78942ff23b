"""Detection campaign: which injected faults sdcguard, Megatron-LM's shipped checks and same-device replay catch,
how soon, at which setting, and who they blame.

Four real multi-process jobs over gloo on the CPU (``benchmarks/campaign/``): the main 3-rank DDP job where every
detector watches the same steps (clean steps, one fault per trial, validation episodes at real schedules), a job
with a dedicated shadow (continuous verification), and the same one-off faults inside the framework's own backward
through the Lightning callback and on an FSDP2 model. What each check sees on the faulty step is measured; the chance
of detection within 1, 10, 100 and 1,000 steps at each setting is derived from the schedule
(:mod:`benchmarks.campaign.schedule`) and checked against the measured episodes. See ``docs/detection.md``.

Run::

    python benchmarks/detection.py [--quick] [--reps N] [--json FILE] [--markdown FILE] [--costs FILE]
    python benchmarks/detection.py --report FILE.json --costs COSTS.json --markdown FILE.md   # re-render only

``--costs``: the JSON written by ``benchmarks/detector_costs.py --json`` (what the workers pay, per setting).
The exit status is 1 when the headline (:func:`benchmarks.campaign.analysis.headline_failures`) does not hold.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT),):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from benchmarks.campaign.analysis import analyse, headline_failures  # noqa: E402
from benchmarks.campaign.faults import BIT_CLASSES, OP_TARGETS, TARGETS, TIMINGS, Trial  # noqa: E402
from benchmarks.campaign.frameworks import FrameworkPlan  # noqa: E402
from benchmarks.campaign.markdown import tables  # noqa: E402
from benchmarks.campaign.peer import MODEL, WORLD, Episode, EpisodeSettings, PeerPlan  # noqa: E402
from benchmarks.campaign.shadow import ShadowPlan, ShadowTrial  # noqa: E402

__all__ = ["Plan", "plan", "run", "main", "headline_failures"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    peer: PeerPlan
    shadow: ShadowPlan
    frameworks: FrameworkPlan
    checkpoints: tuple[int, ...] = (1, 2, 4, 8, 12)
    """Steps at which the validation compares measured and derived detection."""
    quick: bool = False
    jobs: tuple[str, ...] = field(default=("peer", "shadow", "fsdp", "lightning"))


INTERMITTENT_REPS = 3
"""Intermittent cells get this many times the faults of the others: their per-step rates are estimated from them."""


def _peer_trials(reps: int, quick: bool) -> list[Trial]:
    trials, seed = [], 1
    for ti, target in enumerate(TARGETS):
        for mi, timing in enumerate(TIMINGS):
            bits_list = [BIT_CLASSES[(ti + mi) % len(BIT_CLASSES)]] if quick else list(BIT_CLASSES)
            n = reps * (INTERMITTENT_REPS if timing == "intermittent" and not quick else 1)
            for bits in bits_list:
                for _ in range(n):
                    one_off_op = timing == "one-off" and target in OP_TARGETS
                    phase = ("forward", "backward")[seed % 2] if one_off_op else "both"
                    trials.append(
                        Trial(target=target, bits=bits, timing=timing, rank=seed % WORLD, seed=seed, phase=phase)
                    )
                    seed += 1
    return trials


def _episodes(per_kind: int, settings: EpisodeSettings) -> list[Episode]:
    kinds = [
        (t, m)
        for t in ("matmul", "norm", "activation", "embedding", "reduced_grad", "collective", "weights")
        for m in ("one-off", "sticky")
        if not (t == "weights" and m == "sticky")
    ]
    period = math.lcm(settings.replay_every, settings.weight_check_every, settings.hash_every)
    out, seed = [], 5000
    for _ in range(per_kind):
        for target, timing in kinds:
            rnd = random.Random(seed)
            trial = Trial(
                target=target,
                bits=BIT_CLASSES[seed % len(BIT_CLASSES)],
                timing=timing,
                rank=seed % WORLD,
                seed=seed,
                phase=rnd.choice(("forward", "backward")) if timing == "one-off" and target in OP_TARGETS else "both",
            )
            out.append(Episode(trial=trial, start=10_000_000 * (len(out) + 1) * period, phase=rnd.randrange(period)))
            seed += 1
    return out


def _shadow_trials(reps: int, quick: bool) -> list[ShadowTrial]:
    out, seed = [], 9000
    for ti, target in enumerate(TARGETS):
        timings = [TIMINGS[ti % 3]] if quick else list(TIMINGS)
        for timing in timings:
            for _ in range(reps * (INTERMITTENT_REPS if timing == "intermittent" and not quick else 1)):
                phase = ("forward", "backward")[seed % 2] if timing == "one-off" and target in OP_TARGETS else "both"
                out.append(
                    ShadowTrial(
                        trial=Trial(
                            target=target,
                            bits=BIT_CLASSES[seed % len(BIT_CLASSES)],
                            timing=timing,
                            rank=seed % 3,
                            seed=seed,
                            phase=phase,
                        )
                    )
                )
                seed += 1
    for target in OP_TARGETS[: 2 if quick else len(OP_TARGETS)]:  # the schedule's other side: a step not sampled
        out.append(
            ShadowTrial(
                trial=Trial(
                    target=target, bits="exponent", timing="one-off", rank=seed % 3, seed=seed, phase="backward"
                ),
                sampled=False,
            )
        )
        seed += 1
    return sorted(out, key=lambda st: st.trial.rank)  # grouped by worker (see benchmarks/campaign/shadow.py)


def _framework_trials(quick: bool) -> list[Trial]:
    cells = [(t, b) for t in OP_TARGETS for b in BIT_CLASSES]
    if quick:
        cells = [("matmul", "exponent"), ("norm", "sign"), ("activation", "high_mantissa")]
    return [
        Trial(target=t, bits=b, timing="one-off", rank=i % WORLD, seed=7000 + i, phase="backward")
        for i, (t, b) in enumerate(cells)
    ]


def plan(*, quick: bool, reps: int | None = None) -> Plan:
    """The full campaign (``reps`` faults per target x bits x timing cell, default 4) or the quick one."""
    settings = EpisodeSettings()
    if quick:
        peer = PeerPlan(
            trials=tuple(_peer_trials(1, True)),
            clean_steps=40,
            warmup=20,
            episodes=tuple(_episodes(1, settings)[::2]),
            settings=settings,
        )
        return Plan(
            peer=peer,
            shadow=ShadowPlan(trials=tuple(_shadow_trials(1, True)), clean_steps=10),
            frameworks=FrameworkPlan(trials=tuple(_framework_trials(True))),
            quick=True,
        )
    peer = PeerPlan(
        trials=tuple(_peer_trials(reps or 4, False)),
        clean_steps=1000,
        warmup=100,
        episodes=tuple(_episodes(5, settings)),
        settings=settings,
    )
    return Plan(
        peer=peer,
        shadow=ShadowPlan(trials=tuple(_shadow_trials(2, False)), clean_steps=300),
        frameworks=FrameworkPlan(trials=tuple(_framework_trials(False))),
    )


def _run_jobs(p: Plan, timeout: float) -> tuple[list[Any], list[Any], list[Any], list[Any], dict[str, float]]:
    from benchmarks.campaign import frameworks, peer, shadow
    from sdcguard.testing import run_ranks

    seconds: dict[str, float] = {}
    out: dict[str, list[Any]] = {}
    jobs = {
        "peer": (peer.rank_main, WORLD, p.peer),
        "shadow": (shadow.rank_main, 4, p.shadow),
        "fsdp": (frameworks.fsdp_main, WORLD, p.frameworks),
        "lightning": (frameworks.lightning_main, WORLD, p.frameworks),
    }
    for name, (fn, world, arg) in jobs.items():
        if name not in p.jobs or (name == "lightning" and not _has_lightning()):
            out[name] = []
            continue
        t0 = time.monotonic()
        out[name] = run_ranks(fn, world, arg, timeout=timeout)
        seconds[name] = round(time.monotonic() - t0, 1)
    return out["peer"], out["shadow"], out["fsdp"], out["lightning"], seconds


def _has_lightning() -> bool:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        return False
    return True


def _commit() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + (" (with uncommitted changes)" if dirty else "")


def _machine() -> str:
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{platform.machine()}, {cpus} CPUs, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def run(
    p: Plan,
    *,
    timeout: float = 3000.0,
    costs: dict[str, Any] | None = None,
    command: str = "python benchmarks/detection.py",
) -> dict[str, Any]:
    """Run the jobs and analyse them."""
    t0 = time.monotonic()
    peer, shadow, fsdp, lightning, seconds = _run_jobs(p, timeout)
    a = analyse(p, peer, shadow, fsdp, lightning)
    a["settings"] = {
        "replay_every": p.peer.settings.replay_every,
        "weight_check_every": p.peer.settings.weight_check_every,
        "hash_every": p.peer.settings.hash_every,
        "length": p.peer.settings.length,
    }
    a["meta"] = {
        "command": command,
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "model": MODEL,
        "world": WORLD,
        "jobs_s": seconds,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "quick": p.quick,
        "rate": p.peer.rate,
    }
    a["costs"] = costs
    return a


def header(a: dict[str, Any]) -> str:
    m = a["meta"]
    jobs = ", ".join(f"{k} {v} s" for k, v in m["jobs_s"].items())
    return (
        f"Generated by `{m['command']}` at commit {m['commit']} on {m['date']}; {m['machine']}; "
        f"{m['world']} ranks over gloo, model {m['model']}; {a['faults']} faults in the main job "
        f"({a['effective']} changed the step's result), intermittent hit rate {m['rate']} per computation; "
        f"{m['elapsed_s']} s in all ({jobs})."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few faults per target (what CI runs)")
    ap.add_argument("--reps", type=int, default=None, help="faults per target x bits x timing cell (default 4)")
    ap.add_argument("--json", type=Path, help="write every result (each fault's observations) as JSON")
    ap.add_argument("--markdown", type=Path, help="write the tables as markdown")
    ap.add_argument("--costs", type=Path, help="JSON written by benchmarks/detector_costs.py --json")
    ap.add_argument("--report", type=Path, help="render the tables of an earlier run's --json instead of running")
    args = ap.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        ap.error("--reps must be >= 1")
    costs = json.loads(args.costs.read_text(encoding="utf-8")) if args.costs else None
    command = (
        "python benchmarks/detection.py"
        + (" --quick" if args.quick else "")
        + (f" --reps {args.reps}" if args.reps is not None else "")
    )
    if args.report:
        a = json.loads(args.report.read_text(encoding="utf-8"))
        a["costs"] = costs or a.get("costs")
    else:
        a = run(plan(quick=args.quick, reps=args.reps), costs=costs, command=command)
    text = tables(a, header(a), a["costs"])
    print(text)
    if args.json:
        args.json.write_text(json.dumps(a, indent=1, default=str) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    failures = headline_failures(a)
    for f in failures:
        print(f"HEADLINE DOES NOT HOLD: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
