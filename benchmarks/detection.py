"""Detection coverage: which injected faults sdcguard, a loss-spike/NaN detector and same-device replay catch.

One real data-parallel job (3 ranks, gloo, CPU, a tiny transformer with embedding, layernorm, softmax attention,
GELU and dropout, wrapped in DDP) runs three phases; every detector watches the very same steps:

1. ``clean``: at least 1,000 fault-free training steps under ``SDCGuard(replay_every=1)`` (false positives of every
   detector; the loss detector learns its maximum over the first 100).
2. ``coverage``: one fault per step, on one rank: target (aten op families, one rank's reduced gradients, one rank's
   weights, a collective's result) x bit class (sign, exponent, high / low mantissa, zeroing, NaN) x timing
   (transient, sticky). Each trial starts from the same clean weights (restored after every trial) and is judged
   against a fault-free reference computed on the same batch and random state: a fault *changes the step's result*
   when some rank's reduced gradient or weights differ from the reference in any bit; the others are *masked*.
3. ``latency``: a sticky or intermittent fault starts at a step and stays; steps until the guard names the rank,
   at ``replay_every`` 1, 10 and 50.

Detectors, all on the same faults:

- ``sdcguard``: the guard's every-step cross-replica check of reduced gradients, its replay of each micro-batch on
  a peer device (third opinion, re-run) and the weight check (``weight_check_every=1``). Detected: an incident for
  the step; attributed: the incidents name exactly the faulty rank.
- ``loss_spike``: Megatron-LM's checks, :class:`LossSpikeDetector`: NaN/Inf in the local loss or the gradient norm,
  and a local loss at least 10x the largest absolute loss of the first 100 steps. Attributed: it fired on the
  faulty rank only.
- ``same_device``: re-run the whole step (forward, backward, all-reduce) on the same device with the same inputs,
  weights and random state, and compare loss, local and reduced gradients bit for bit (torchtitan-style
  same-device replay). Suspects: the ranks whose local result differs, else those whose reduced result differs.

Run::

    python benchmarks/detection.py [--quick] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "tests"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

OP_TARGETS = ("matmul", "attention", "norm", "activation", "embedding", "loss")
TARGETS = (*OP_TARGETS, "reduced_grad", "weights", "collective")
BIT_CLASSES = ("sign", "exponent", "high_mantissa", "low_mantissa", "zero", "nan")
TIMINGS = ("transient", "sticky")
DETECTORS = ("sdcguard", "loss_spike", "same_device")
TARGET_LABELS = {
    "matmul": "matmul (mm/addmm/bmm)",
    "attention": "attention (softmax)",
    "norm": "layernorm",
    "activation": "GELU",
    "embedding": "embedding",
    "loss": "loss (log_softmax/nll)",
    "reduced_grad": "one rank's reduced gradients",
    "weights": "one rank's weights",
    "collective": "all-reduce result",
}
WORLD = 3
MODEL = {"d": 16, "heads": 2, "layers": 1, "seq": 8, "p": 0.1}
BATCH = 4


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One fault on one step."""

    target: str
    bits: str
    timing: str
    rank: int
    seed: int

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: use one of {', '.join(TARGETS)}")
        if self.bits not in BIT_CLASSES:
            raise ValueError(f"unknown bit class {self.bits!r}: use one of {', '.join(BIT_CLASSES)}")
        if self.timing not in (*TIMINGS, "intermittent"):
            raise ValueError(f"unknown timing {self.timing!r}")
        if not 0 <= self.rank < WORLD:
            raise ValueError(f"rank must be in 0..{WORLD - 1}, got {self.rank}")


@dataclass(frozen=True, kw_only=True)
class Campaign:
    """What one run does (``--quick`` is a smaller one)."""

    trials: tuple[Trial, ...]
    clean_steps: int = 1000
    warmup: int = 100
    """Steps whose largest loss the loss-spike detector keeps (Megatron: 100)."""
    latency: tuple[tuple[int, str, int], ...] = ()
    """(replay_every, timing, seed) of each latency run."""
    latency_cap: int = 200
    """Give up on a latency run after this many steps."""
    intermittent_rate: float = 0.3
    """Chance that an intermittent fault hits each computation (each matching op call)."""

    def __post_init__(self) -> None:
        if self.clean_steps < 0 or self.warmup < 1 or self.latency_cap < 1:
            raise ValueError("clean_steps must be >= 0, warmup and latency_cap >= 1")
        if not 0.0 < self.intermittent_rate <= 1.0:
            raise ValueError(f"intermittent_rate must be in (0, 1], got {self.intermittent_rate}")
        if any(n < 1 or t not in ("sticky", "intermittent") for n, t, _ in self.latency):
            raise ValueError("latency runs need replay_every >= 1 and a sticky or intermittent timing")


class LossSpikeDetector:
    """Megatron-LM's NaN and loss-spike checks, as its ``RerunStateMachine`` and DDP ship them (one per rank).

    Per rank, each naming this rank when it fires (``validate_result`` records the rank):

    - ``nonfinite_loss``: ``validate_result(loss, torch.isnan)`` and ``(loss, torch.isinf)`` on the local loss;
    - ``spiky_loss``: ``is_unexpectedly_large(loss, threshold=10, context="loss")``: the first ``num_samples``
      (100) absolute values set a maximum and never fire, later values fire when ``>= threshold * max``; NaN and
      Inf are ignored there (checked separately);
    - ``nonfinite_local_grad``: DDP's ``check_for_nan_in_grad``: NaN/Inf in the norm of the local gradients, before
      the all-reduce.

    And one global check that skips the step without naming a rank: ``nonfinite_grad_norm``, NaN/Inf in the norm of
    the reduced gradients (the optimizer's found-inf check).
    """

    NAMING = ("nonfinite_loss", "spiky_loss", "nonfinite_local_grad")

    def __init__(self, *, threshold: float = 10.0, num_samples: int = 100) -> None:
        self.threshold = threshold
        self.num_samples = num_samples
        self.count = 0
        self.max_value = 0.0

    def check(self, loss: float, local_grad_norm: float, grad_norm: float) -> list[str]:
        """Which checks fire for this step (empty: none)."""
        fired = []
        if math.isnan(loss) or math.isinf(loss):
            fired.append("nonfinite_loss")
        if self._unexpectedly_large(loss):
            fired.append("spiky_loss")
        if not math.isfinite(local_grad_norm):
            fired.append("nonfinite_local_grad")
        if not math.isfinite(grad_norm):
            fired.append("nonfinite_grad_norm")
        return fired

    def _unexpectedly_large(self, loss: float) -> bool:
        value = math.fabs(loss)
        if math.isnan(value) or math.isinf(value):
            return False
        if self.count < self.num_samples:
            self.count += 1
            self.max_value = max(self.max_value, value)
            return False
        return value >= self.max_value * self.threshold


# ---------------------------------------------------------------------------------------------- the job (per rank)


def _bits_equal(a: Any, b: Any) -> bool:
    import torch

    ints = {4: torch.int32, 8: torch.int64, 2: torch.int16}
    return bool(torch.equal(a.reshape(-1).view(ints[a.element_size()]), b.reshape(-1).view(ints[b.element_size()])))


def _fault(trial: Trial, *, rate: float = 1.0) -> Any:
    from sdcguard.inject.faults import Fault

    pattern = {"zero": "zero", "nan": "nan"}.get(trial.bits, "bitflip")
    bit = None if pattern != "bitflip" else trial.bits
    if trial.timing == "intermittent":
        return Fault(pattern=pattern, bit=bit, timing="intermittent", rate=rate, seed=trial.seed)
    return Fault(pattern=pattern, bit=bit, timing=trial.timing, seed=trial.seed)


class _Injector:
    """Installs one trial's fault on its rank (a no-op on the others); counts what the fault model changed."""

    def __init__(self, trial: Trial, guard: Any, module: Any, rank: int, calls: dict[str, int], *,
                 rate: float = 1.0) -> None:
        from sdcguard.inject.faults import FaultModel
        from sdcguard.inject.torch_faults import OpFaultMode

        self.trial, self.guard, self.module = trial, guard, module
        self.here = rank == trial.rank
        self.model = FaultModel(_fault(trial, rate=rate))
        self.records: list[Any] = []
        self.mode: Any = None
        if self.here and trial.target in OP_TARGETS:
            # A transient fault hits one op call of the step, forward or backward (which one: from the seed);
            # a sticky (or intermittent) one is a broken unit: every call of the family, in every pass.
            occurrence = None
            if trial.timing == "transient":
                occurrence = random.Random(trial.seed).randrange(max(1, calls[trial.target]))
            self.mode = OpFaultMode(self.model, ops=trial.target, phase="both", rank=trial.rank,
                                    occurrence=occurrence)

    def start_step(self, step: int) -> None:
        """Before the step: a weight fault corrupts this rank's weights in memory (they stay corrupted)."""
        if self.mode is not None:
            self.mode.step = step
        if self.here and self.trial.target == "weights":
            from sdcguard.inject.torch_faults import corrupt_weights_

            self.records += corrupt_weights_(self.module, self.model, step=step)

    @contextmanager
    def active(self) -> Iterator[None]:
        """While the step (and any re-run of it) runs on this rank."""
        if not self.here:
            yield
            return
        if self.mode is not None:
            with self.mode:
                yield
            return
        if self.trial.target not in ("reduced_grad", "collective"):
            yield
            return
        import torch.distributed as dist

        from sdcguard.inject.torch_faults import corrupt_tensor_

        guard, model, real = self.guard, self.model, self.guard._all_reduce
        target = self.trial.target

        # The guard's bucketed all-reduce is instance state; wrapping it on this rank only leaves every rank's
        # collectives unchanged. ``reduced_grad``: the averaged buckets are corrupted after the reduction (memory);
        # ``collective``: the all-reduce's own result, before the division by the group size (a faulty link).
        def faulty(grads: list[Any]) -> list[Any]:
            if target == "reduced_grad":
                out = real(grads)
                for flat in guard._flats:
                    self.records += corrupt_tensor_(flat, model, target="reduced_grad")
                return out
            plain = dist.all_reduce

            def corrupting(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                work = plain(tensor, *args, **kwargs)
                self.records.extend(corrupt_tensor_(tensor, model, target="all_reduce"))
                return work

            dist.all_reduce = corrupting
            try:
                return real(grads)
            finally:
                dist.all_reduce = plain

        guard._all_reduce = faulty
        try:
            yield
        finally:
            guard._all_reduce = real

    def changed(self) -> int:
        recs = self.records + (self.mode.records if self.mode is not None else [])
        return sum(1 for r in recs if r.changed)


def _count_op_calls(module: Any, params: list[Any], batch: Any) -> dict[str, int]:
    """Matching aten calls per op family in one forward + backward (transient faults pick one of them)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from _tiny_transformer import lm_loss
    from sdcguard.inject.torch_faults import OP_FAMILIES
    from sdcguard.replay import local_gradients

    class Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = dict.fromkeys(OP_TARGETS, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            target = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(target, torch.Tensor) and target.is_floating_point() and target.numel():
                for fam in OP_TARGETS:
                    if name in OP_FAMILIES[fam]:
                        self.n[fam] += 1
            return out

    state = torch.get_rng_state()
    with Counter() as c:
        local_gradients(module, lm_loss, params, batch)
    torch.set_rng_state(state)
    return c.n


def _rank_main(rank: int, world: int, campaign: Campaign) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's collective renames, once per call
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from _tiny_transformer import TinyTransformer, lm_loss, make_batch
    from sdcguard.guard import SDCGuard
    from sdcguard.replay import local_gradients

    torch.manual_seed(0)
    model = TinyTransformer(**MODEL)
    ddp = DDP(model)
    guards = {n: SDCGuard(ddp, lm_loss, replay_every=n, weight_check_every=1, on_detect="record")
              for n in sorted({1, *(n for n, _, _ in campaign.latency)})}
    guard = guards[1]
    params = guard.params
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    spike = LossSpikeDetector(num_samples=campaign.warmup)
    seq = MODEL["seq"]
    out: dict[str, Any] = {"rank": rank}

    def batch_for(step: int) -> Any:
        return make_batch(step, rank, batch=BATCH, seq=seq)

    def reduce(grads: list[Any]) -> list[Any]:
        return guard._all_reduce(grads)  # the guard's own bucketing and averaging (reference and re-run)

    def norm(grads: list[Any]) -> float:
        return float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])).item())

    def grad_norm() -> float:
        return norm([p.grad for p in params if p.grad is not None])

    seen_local: list[Any] = []

    @contextmanager
    def keeping_local() -> Iterator[None]:
        """Keep the step's local gradients (what the guard all-reduces) for the baselines."""
        inner = guard._all_reduce

        def keep(grads: list[Any]) -> list[Any]:
            seen_local[:] = [g.clone() for g in grads]
            return inner(grads)

        guard._all_reduce = keep
        try:
            yield
        finally:
            guard._all_reduce = inner

    def incidents_of(found: Any, step: int) -> list[tuple[str, tuple[int, ...]]]:
        return [(i.kind, tuple(i.suspect_ranks)) for i in found if i.step == step]

    # ---- phase 1: clean training steps: false positives of every detector -------------------------------------
    t0 = time.monotonic()
    fp = {"steps": 0, "sdcguard": 0, "loss_spike": 0, "same_device": 0, "calibrated": None}
    cal = guard.calibrate(batch_for(-1))
    fp["calibrated"] = cal.deterministic
    for step in range(campaign.clean_steps):
        torch.manual_seed(10_000 + 7 * step + rank)
        batch = batch_for(step)
        rng = torch.get_rng_state()
        with keeping_local():
            report = guard.step(step, batch)
        fp["sdcguard"] += int(bool(report.incidents))
        fired = spike.check(float(report.loss), norm(seen_local), grad_norm())
        fp["loss_spike"] += int(bool(fired))
        # same-device replay of the step: identical inputs, weights and random state on the same device
        torch.set_rng_state(rng)
        loss2, local2 = local_gradients(guard.module, lm_loss, params, batch)
        reduced2 = reduce(local2)
        same = _bits_equal(loss2, report.loss) and all(
            _bits_equal(r, p.grad) for r, p in zip(reduced2, params))
        fp["same_device"] += int(not same)
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        fp["sdcguard"] += int(bool(guard.after_optimizer_step()))
        fp["steps"] += 1
    out["false_positives"] = fp
    out["clean_s"] = time.monotonic() - t0

    # ---- phase 2: one fault per step, every trial from the same clean weights ----------------------------------
    t0 = time.monotonic()
    snapshot = [p.detach().clone() for p in params]
    calls = _count_op_calls(guard.module, params, batch_for(0))
    out["op_calls"] = calls
    base = campaign.clean_steps
    trials: list[dict[str, Any]] = []
    for i, trial in enumerate(campaign.trials):
        step = base + i
        torch.manual_seed(20_000 + 7 * i + rank)
        batch = batch_for(step)
        rng = torch.get_rng_state()
        # fault-free reference of the step's result (same batch, weights and random state)
        ref_loss, ref_local = local_gradients(guard.module, lm_loss, params, batch)
        ref_reduced = [g.clone() for g in reduce(ref_local)]
        torch.set_rng_state(rng)
        inj = _Injector(trial, guard, guard.module, rank, calls)
        inj.start_step(step)
        with inj.active():
            with keeping_local():
                report = guard.step(step, batch)
            orig_local = list(seen_local)
            reduced = [p.grad.detach().clone() for p in params]
            # same-device replay, the fault still present: a sticky fault repeats, a transient one is spent
            torch.set_rng_state(rng)
            loss2, local2 = local_gradients(guard.module, lm_loss, params, batch)
            reduced2 = reduce(local2)
        found = incidents_of(report.incidents, step)
        found += incidents_of(guard.after_optimizer_step(), step)  # weights compared across replicas (no update)
        fired = spike.check(float(report.loss), norm(orig_local), grad_norm())
        effective_grad = not all(_bits_equal(a, b) for a, b in zip(reduced, ref_reduced))
        effective_weights = not all(_bits_equal(p.detach(), s) for p, s in zip(params, snapshot))
        trials.append({
            "sdcguard": found,
            "loss_spike": fired,
            "same_device_local": not (_bits_equal(loss2, report.loss)
                                      and all(_bits_equal(a, b) for a, b in zip(local2, orig_local))),
            "same_device_reduced": not all(_bits_equal(a, b) for a, b in zip(reduced2, reduced)),
            "effective": effective_grad or effective_weights,
            "loss_changed": not _bits_equal(report.loss, ref_loss),
            "changed": inj.changed(),
        })
        with torch.no_grad():  # back to the clean state: the next trial is independent of this one
            for p, s in zip(params, snapshot):
                p.copy_(s)
        opt.zero_grad(set_to_none=True)
    out["trials"] = trials
    out["coverage_s"] = time.monotonic() - t0

    # ---- phase 3: steps until detection at replay_every N ------------------------------------------------------
    t0 = time.monotonic()
    latency = []
    for j, (every, timing, seed) in enumerate(campaign.latency):
        g = guards[every]
        rnd = random.Random(seed)
        trial = Trial(target=rnd.choice(("matmul", "norm", "activation", "embedding")),
                      bits=rnd.choice(("sign", "exponent", "high_mantissa", "low_mantissa")),
                      timing=timing, rank=rnd.randrange(world), seed=seed)
        # Start at a random phase of the sampling schedule (step numbers far apart between runs).
        start = 100_000 * (j + 1) + rnd.randrange(every)
        inj = _Injector(trial, g, g.module, rank, calls, rate=campaign.intermittent_rate)
        detected_at, named, step = None, None, start
        while step < start + campaign.latency_cap:
            torch.manual_seed(30_000 + step + rank)
            inj.start_step(step)
            with inj.active():
                report = g.step(step, batch_for(step))
            opt.zero_grad(set_to_none=True)
            found = [inc for inc in report.incidents if inc.kind != "nondeterministic"]
            if found:  # the same on every rank: the loop ends at the same step everywhere
                detected_at = step
                named = sorted({r for inc in found for r in inc.suspect_ranks})
                break
            step += 1
        latency.append({"replay_every": every, "timing": timing, "target": trial.target, "bits": trial.bits,
                        "rank": trial.rank, "start": start, "detected_at": detected_at, "named": named,
                        "changed": inj.changed()})
    out["latency"] = latency
    out["latency_s"] = time.monotonic() - t0
    dist.barrier()
    return out


# ---------------------------------------------------------------------------------------------- analysis


def _judge(trial: Trial, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the ranks' views of one trial into each detector's (detected, attributed)."""
    r = trial.rank
    guard_suspects = sorted({s for res in per_rank for _, sus in res["sdcguard"] for s in sus})
    guard_detected = any(res["sdcguard"] for res in per_rank)
    spike_ranks = [k for k, res in enumerate(per_rank) if set(res["loss_spike"]) & set(LossSpikeDetector.NAMING)]
    spike_detected = any(res["loss_spike"] for res in per_rank)
    local_ranks = [k for k, res in enumerate(per_rank) if res["same_device_local"]]
    reduced_ranks = [k for k, res in enumerate(per_rank) if res["same_device_reduced"]]
    same_suspects = local_ranks or reduced_ranks
    return {
        **asdict(trial),
        "effective": any(res["effective"] for res in per_rank),
        "loss_changed": any(res["loss_changed"] for res in per_rank),
        "changed_elements": per_rank[r]["changed"],
        "sdcguard": {"detected": guard_detected, "attributed": guard_detected and guard_suspects == [r],
                     "suspects": guard_suspects,
                     "kinds": sorted({k for res in per_rank for k, _ in res["sdcguard"]})},
        "loss_spike": {"detected": spike_detected, "attributed": spike_detected and spike_ranks == [r],
                       "suspects": spike_ranks, "checks": sorted({c for res in per_rank for c in res["loss_spike"]})},
        "same_device": {"detected": bool(same_suspects), "attributed": same_suspects == [r],
                        "suspects": same_suspects},
    }


def _rate(k: int, n: int) -> str:
    return "–" if n == 0 else f"{100.0 * k / n:.0f}%"


def _summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    out: dict[str, Any] = {"faults": n}
    for d in DETECTORS:
        out[d] = {"detected": sum(r[d]["detected"] for r in rows), "attributed": sum(r[d]["attributed"] for r in rows)}
    return out


def analyse(campaign: Campaign, results: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    judged = [_judge(t, [res["trials"][i] for res in results]) for i, t in enumerate(campaign.trials)]
    cells = []
    for target in TARGETS:
        for bits in BIT_CLASSES:
            for timing in TIMINGS:
                rows = [j for j in judged if (j["target"], j["bits"], j["timing"]) == (target, bits, timing)]
                if not rows:
                    continue
                eff = [j for j in rows if j["effective"]]
                cells.append({"target": target, "bits": bits, "timing": timing, "faults": len(rows),
                              "effective": _summarise(eff), "masked": _summarise([j for j in rows
                                                                                  if not j["effective"]])})
    effective = [j for j in judged if j["effective"]]
    masked = [j for j in judged if not j["effective"]]
    by_timing = {t: _summarise([j for j in effective if j["timing"] == t]) for t in TIMINGS}
    by_target = {t: _summarise([j for j in effective if j["target"] == t]) for t in TARGETS}
    by_bits = {b: _summarise([j for j in effective if j["bits"] == b]) for b in BIT_CLASSES}
    misses = [j for j in effective if not (j["sdcguard"]["detected"] and j["sdcguard"]["attributed"])]
    lat = []
    for every in sorted({x["replay_every"] for x in results[0]["latency"]}):
        for timing in ("sticky", "intermittent"):
            runs = [x for x in results[0]["latency"] if (x["replay_every"], x["timing"]) == (every, timing)]
            if not runs:
                continue
            steps = [x["detected_at"] - x["start"] for x in runs if x["detected_at"] is not None]
            right = sum(1 for x in runs if x["named"] == [x["rank"]])
            lat.append({"replay_every": every, "timing": timing, "faults": len(runs), "detected": len(steps),
                        "attributed": right, "mean": statistics.mean(steps) if steps else None,
                        "median": statistics.median(steps) if steps else None,
                        "max": max(steps) if steps else None, "runs": runs})
    fp = {"steps": results[0]["false_positives"]["steps"],
          "calibrated_deterministic": all(res["false_positives"]["calibrated"] for res in results)}
    for d in DETECTORS:
        fp[d] = sum(res["false_positives"][d] for res in results)  # rank-steps on which it fired
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()}: {platform.machine()}, {_cpus()} CPUs, {platform.system()} "
                   f"{platform.release()}, Python {platform.python_version()}, torch {_torch_version()}",
        "world": WORLD, "model": MODEL, "batch": BATCH, "elapsed_s": round(elapsed, 1),
        "phase_s": {k: round(max(res[k] for res in results), 1) for k in ("clean_s", "coverage_s", "latency_s")},
        "op_calls": results[0]["op_calls"],
        "false_positives": fp,
        "totals": {"effective": _summarise(effective), "masked": _summarise(masked),
                   "masked_loss_changed": _summarise([j for j in masked if j["loss_changed"]])},
        "by_timing": by_timing, "by_target": by_target, "by_bits": by_bits,
        "cells": cells, "latency": lat,
        "sdcguard_misses": misses,
        "trials": judged,
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def _torch_version() -> str:
    import torch

    return torch.__version__


def _pair(s: dict[str, Any], d: str) -> str:
    n = s["faults"]
    return f"{_rate(s[d]['detected'], n)} / {_rate(s[d]['attributed'], n)}"


def markdown(a: dict[str, Any], command: str) -> str:
    """The report as markdown: summaries, the full coverage table, latency and false positives."""
    L: list[str] = []
    fp = a["false_positives"]
    L.append(f"Generated by `{command}` on {a['date']}; machine: {a['machine']}; {a['world']} ranks over gloo, "
             f"model {a['model']}, batch {a['batch']}; {a['elapsed_s']} s in all.")
    L.append("")
    L.append("Each cell: detection rate / correct-attribution rate (the detector named exactly the faulty rank).")
    L.append("")
    L.append("### Summary: faults that change the step's result")
    L.append("")
    L.append("| faults | n | sdcguard | loss spike + NaN (Megatron-LM) | same-device replay |")
    L.append("|---|---:|---|---|---|")
    rows = [("all", a["totals"]["effective"])]
    rows += [(f"timing: {t}", s) for t, s in a["by_timing"].items()]
    rows += [(f"target: {TARGET_LABELS[t]}", s) for t, s in a["by_target"].items()]
    rows += [(f"bits: {b}", s) for b, s in a["by_bits"].items()]
    for name, s in rows:
        if s["faults"]:
            L.append(f"| {name} | {s['faults']} | " + " | ".join(_pair(s, d) for d in DETECTORS) + " |")
    m = a["totals"]["masked"]
    L.append(f"| masked (result unchanged) | {m['faults']} | " + " | ".join(_pair(m, d) for d in DETECTORS) + " |")
    lo = a["totals"]["masked_loss_changed"]
    if lo["faults"]:
        L.append(f"| masked, but the reported loss changed | {lo['faults']} | "
                 + " | ".join(_pair(lo, d) for d in DETECTORS) + " |")
    L.append("")
    L.append("### Coverage: target x bit class x timing")
    L.append("")
    L.append("Counts of faults that changed the step's result (`eff`) and of masked ones (`masked`); rates over `eff`.")
    L.append("")
    L.append("| target | bits | timing | eff | masked | sdcguard | loss spike + NaN | same-device replay |")
    L.append("|---|---|---|---:|---:|---|---|---|")
    for c in a["cells"]:
        e = c["effective"]
        rates = " | ".join(_pair(e, d) if e["faults"] else "–" for d in DETECTORS)
        L.append(f"| {TARGET_LABELS[c['target']]} | {c['bits']} | {c['timing']} | {e['faults']} | "
                 f"{c['masked']['faults']} | {rates} |")
    L.append("")
    L.append("### Steps until detection (sdcguard)")
    L.append("")
    L.append("| replay_every | timing | faults | detected | attributed | mean steps | median | max |")
    L.append("|---:|---|---:|---:|---:|---:|---:|---:|")
    for x in a["latency"]:
        f = (lambda v: "–" if v is None else f"{v:g}")
        L.append(f"| {x['replay_every']} | {x['timing']} | {x['faults']} | {x['detected']} | {x['attributed']} | "
                 f"{f(x['mean'])} | {f(x['median'])} | {f(x['max'])} |")
    L.append("")
    L.append("### False positives on clean steps")
    L.append("")
    L.append(f"{fp['steps']} clean training steps x {a['world']} ranks (calibrated bit-identical: "
             f"{fp['calibrated_deterministic']}); rank-steps on which each detector fired: sdcguard {fp['sdcguard']}, "
             f"loss spike + NaN {fp['loss_spike']}, same-device replay {fp['same_device']}.")
    misses = a["sdcguard_misses"]
    L.append("")
    if misses:
        L.append("### Faults that changed the result but sdcguard did not detect and attribute")
        L.append("")
        for j in misses:
            L.append(f"- {j['target']} / {j['bits']} / {j['timing']} on rank {j['rank']} (seed {j['seed']}): "
                     f"detected {j['sdcguard']['detected']}, suspects {j['sdcguard']['suspects']}, "
                     f"checks {j['sdcguard']['kinds']}")
    else:
        L.append("sdcguard detected and correctly attributed every fault that changed the step's result.")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------------------------------------- planning and main


def plan(*, quick: bool, reps: int | None = None) -> Campaign:
    """The full grid (``reps`` faults per cell, on rotating ranks) or the quick one."""
    reps = reps if reps is not None else (1 if quick else 5)
    trials = []
    seed = 1
    for target in TARGETS:
        for bits in BIT_CLASSES:
            for timing in TIMINGS:
                for k in range(reps):
                    trials.append(Trial(target=target, bits=bits, timing=timing, rank=(seed + k) % WORLD, seed=seed))
                    seed += 1
    if quick:
        latency = tuple((n, t, 500 + i) for i, (n, t) in enumerate(
            [(1, "sticky"), (1, "intermittent"), (10, "sticky"), (10, "intermittent")]))
        return Campaign(trials=tuple(trials), clean_steps=120, latency=latency, latency_cap=60)
    latency = tuple((n, t, 500 + 10 * i + k) for i, (n, t) in enumerate(
        [(n, t) for n in (1, 10, 50) for t in ("sticky", "intermittent")]) for k in range(5))
    return Campaign(trials=tuple(trials), clean_steps=1000, latency=latency, latency_cap=200)


def run(campaign: Campaign, *, timeout: float = 3000.0) -> dict[str, Any]:
    """Run the job on ``WORLD`` gloo ranks and analyse it."""
    from _dist import run_ranks

    t0 = time.monotonic()
    results = run_ranks(_rank_main, WORLD, campaign, timeout=timeout)
    return analyse(campaign, results, time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one fault per cell, 120 clean steps, short latency runs")
    ap.add_argument("--reps", type=int, default=None, help="faults per cell (default 5; --quick 1)")
    ap.add_argument("--clean-steps", type=int, default=None, help="clean steps (default 1000; --quick 120)")
    ap.add_argument("--json", type=Path, help="write the full results (every trial) as JSON")
    ap.add_argument("--markdown", type=Path, help="write the tables as markdown")
    args = ap.parse_args(argv)
    if (args.reps is not None and args.reps < 1) or (args.clean_steps is not None and args.clean_steps < 0):
        ap.error("--reps must be >= 1 and --clean-steps >= 0")
    campaign = plan(quick=args.quick, reps=args.reps)
    if args.clean_steps is not None:
        campaign = replace(campaign, clean_steps=args.clean_steps)
    command = "python benchmarks/detection.py" + (" --quick" if args.quick else "") + (
        f" --reps {args.reps}" if args.reps is not None else "") + (
        f" --clean-steps {args.clean_steps}" if args.clean_steps is not None else "")
    result = run(campaign)
    text = markdown(result, command)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
