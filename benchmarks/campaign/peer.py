"""The main job: 3 data-parallel ranks (gloo, CPU processes), a small transformer in DDP, every detector on the same
steps.

Each rank builds the model, wraps it in DDP with :class:`~.baselines.BucketTap` as its comm hook, and two guards on
that DDP model: ``trials`` (``replay_every=1, weight_check_every=1``: every check runs on every step, so one step
says what each check sees) and ``episodes`` (the validation settings, ``on_detect="record"``). Phases:

1. **clean**: fault-free steps; whatever any detector raises here is a false alarm. Megatron's detectors learn
   their maxima over the first 100 (``warmup``) of them.
2. **trials**: one fault per trial, on a step ``s`` and its follow-up ``s + 1`` (the fault gone: what its damage left
   behind). Before each trial the weights and Megatron's detectors' state are restored; the guard's state is not (one
   long run per job, as a real job meets faults on different devices one after another, with ``escalate="off"`` so that
   a sticky verdict does not end the run). Each trial's step is driven by the guard's four public calls; the clean
   reference of the same step (same batch, weights and random state) says whether the fault changed the result. The
   world is the one *without* a veto: the step's own (possibly corrupted) update is applied whatever the guard decided
   (``report.commit`` is kept, so the veto is measured too), since that is what a detector that does not veto, or a
   guard that did not sample the step, lets through.
3. **episodes**: the measured check of the derivation: faults at a random phase of the real schedules
   (``replay_every`` and ``weight_check_every`` of the episode guard, Megatron's hash interval), followed step by
   step until each detector names something or the episode ends.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from .baselines import (
    BucketTap,
    MegatronChecks,
    all_bits_equal,
    bits_equal,
    bucket_norms,
    param_hash_mismatch,
    rerun_step,
)
from .faults import Injector, Trial, count_op_calls

WORLD = 3
MODEL = {"d": 16, "heads": 2, "layers": 1, "seq": 8, "p": 0.1}
BATCH = 4
LR = 0.05


@dataclass(frozen=True, kw_only=True)
class Episode:
    """One validation episode: ``trial``'s fault starts at step ``start + phase`` and is followed ``length`` steps."""

    trial: Trial
    start: int
    phase: int


@dataclass(frozen=True, kw_only=True)
class EpisodeSettings:
    replay_every: int = 4
    weight_check_every: int = 8
    hash_every: int = 8
    length: int = 12


@dataclass(frozen=True, kw_only=True)
class PeerPlan:
    trials: tuple[Trial, ...]
    clean_steps: int = 1000
    warmup: int = 100
    """Calls over which Megatron's ``is_unexpectedly_large`` learns its maximum (Megatron: 100)."""
    rate: float = 0.05
    """Per-computation hit probability of an intermittent fault."""
    episodes: tuple[Episode, ...] = ()
    settings: EpisodeSettings = field(default_factory=EpisodeSettings)

    def __post_init__(self) -> None:
        if self.clean_steps <= self.warmup:
            raise ValueError("clean_steps must exceed warmup: Megatron's detectors learn their maxima on clean steps")


class _Rank:
    """One rank's model, detectors and step (see the module docstring)."""

    def __init__(self, rank: int, plan: PeerPlan) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from sdcguard import SDCGuard
        from sdcguard.testing.models import TinyTransformer, lm_loss

        self.rank, self.plan, self.loss_fn = rank, plan, lm_loss
        torch.manual_seed(0)
        self.model = TinyTransformer(**MODEL)
        self.ddp = DDP(self.model)
        self.tap = BucketTap()
        self.ddp.register_comm_hook(None, self.tap)
        # one long run: no state restored between trials, so escalation (a sticky verdict) must let it go on
        # slow=None: the slow-rank timing measures the machine's load, not a fault (a loaded CI machine made a clean
        # step's `slow` incident count as a false alarm), and a `slow` incident never vetoes
        self.guard = SDCGuard(
            self.ddp,
            lm_loss,
            replay_every=1,
            weight_check_every=1,
            on_detect="skip",
            escalate="off",
            checksum_every=1,
            slow=None,
        )
        st = plan.settings
        self.episode_guard = SDCGuard(
            self.ddp,
            lm_loss,
            replay_every=st.replay_every,
            weight_check_every=st.weight_check_every,
            on_detect="record",
            checksum_every=0,
            slow=None,
        )  # the validation episodes derive replay and the rest
        self.params = [p for p in self.model.parameters()]
        self.opt = torch.optim.SGD(self.params, lr=LR)
        self.megatron = MegatronChecks(num_samples=plan.warmup)
        self.reference(self.batch(-2))  # DDP rebuilds its buckets after its first backward: before anything counts

    def batch(self, step: int) -> Any:
        from sdcguard.testing.models import make_batch

        return make_batch(step, self.rank, batch=BATCH, seq=MODEL["seq"])

    def reference(self, batch: Any) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The fault-free loss and reduced gradients of a step (the random stream is put back)."""
        rng = torch.get_rng_state()
        for p in self.params:
            p.grad = None
        loss = self.loss_fn(self.ddp, batch)
        loss.backward()
        out = [None if p.grad is None else p.grad.clone() for p in self.params]
        for p in self.params:
            p.grad = None
        torch.set_rng_state(rng)
        return loss.detach(), out

    def step(self, guard: Any, step: int, batch: Any, inj: Injector | None, *, hash_now: bool = True) -> dict[str, Any]:
        """One observed step, in the world without a veto; what every detector saw."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if inj is not None:
            inj.set_step(step)
            if inj.comm_hook is not None:
                self.tap.inner = inj.comm_hook
        for p in self.params:
            p.grad = None
        rng = torch.get_rng_state()
        after_bwd = (lambda: inj.after_backward(self.model, step)) if inj is not None else None
        # The one-off fault's mode sits below the guard's checksum mode (a real fault is inside the kernel); its
        # occurrence is one call of the original forward or backward, so the guard's later replays are untouched.
        with inj.unit() if inj is not None else nullcontext(), inj.original() if inj is not None else nullcontext():
            guard.begin_step(step)
            guard.before_forward(batch)
            self.tap.keep = True
            loss = self.loss_fn(self.ddp, batch)
            guard.observe_loss(loss)
            loss.backward()
            if after_bwd is not None:
                after_bwd()
            local = self.tap.take()
            reduced = [None if p.grad is None else p.grad.clone() for p in self.params]
            report = guard.end_step(loss=loss.detach())
            same = rerun_step(
                self.ddp,
                self.params,
                self.loss_fn,
                batch,
                rng,
                self.tap,
                loss=loss,
                local=local,
                reduced=reduced,
                after_backward=after_bwd,
            )
        self.tap.inner = allreduce_hook
        megatron = self.megatron.check(float(loss.detach()), bucket_norms(local))
        for p, g in zip(self.params, reduced):  # the world without a veto: the step's own update is applied
            p.grad = g
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if inj is not None:
            inj.after_optimizer(self.model, step)
        weights = guard.after_optimizer_step()
        return {
            "loss": loss.detach(),
            "reduced": reduced,
            "commit": report.commit,
            "sdcguard": [(i.kind, list(i.suspect_ranks)) for i in (*report.incidents, *weights)],
            "megatron": megatron,
            "hash": param_hash_mismatch(self.model) if hash_now else [],
            "same_device": [same.local_differs, same.reduced_differs],
            # what the step's checksums covered: matmuls checked / unverifiable / run (0s on an unchecked step)
            "matmuls": [report.matmuls_checked, report.matmuls_unverifiable, report.matmuls_run],
        }

    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def restore(self, snap: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, s in zip(self.params, snap):
                p.copy_(s)
        self.opt.zero_grad(set_to_none=True)
        for guard in (self.guard, self.episode_guard):  # a write of the weights: the memory check's new reference
            guard.after_optimizer_step()


def _public(obs: dict[str, Any]) -> dict[str, Any]:
    return {k: obs[k] for k in ("commit", "sdcguard", "megatron", "hash", "same_device")}


def _clean(r: _Rank, steps: int) -> dict[str, Any]:
    fired: dict[str, Any] = {"sdcguard": 0, "megatron": 0, "same_device": 0, "hash": 0, "steps": 0}
    fired["matmuls"] = [0, 0, 0]  # summed over the clean steps: checked, unverifiable, run
    kinds: list[Any] = []
    t0 = time.monotonic()
    for step in range(steps):
        torch.manual_seed(10_000 + 7 * step + r.rank)
        obs = r.step(r.guard, step, r.batch(step), None)
        fired["sdcguard"] += int(bool(obs["sdcguard"]))
        fired["megatron"] += int(bool(obs["megatron"]))
        fired["same_device"] += int(any(obs["same_device"]))
        fired["hash"] += int(bool(obs["hash"]))
        fired["steps"] += 1
        fired["matmuls"] = [a + b for a, b in zip(fired["matmuls"], obs["matmuls"])]
        if obs["sdcguard"] or obs["megatron"]:
            kinds.append((step, obs["sdcguard"], obs["megatron"]))
    fired["seconds"] = time.monotonic() - t0
    fired["events"] = kinds
    return fired


def _trial(
    r: _Rank, i: int, trial: Trial, step: int, calls: Any, snap: list[torch.Tensor], states: tuple[Any, Any]
) -> dict[str, Any]:
    r.restore(snap)
    r.megatron.load_state_dict(states[1])
    inj = Injector(trial, r.rank, calls, rate=r.plan.rate)
    torch.manual_seed(20_000 + 7 * i + r.rank)
    batch = r.batch(step)
    ref_loss, ref_reduced = r.reference(batch)
    obs = r.step(r.guard, step, batch, inj)
    effective = not all_bits_equal(obs["reduced"], ref_reduced) or (trial.target == "weights" and inj.changed() > 0)
    out = {
        "hit": _public(obs),
        "effective": effective,
        "loss_changed": not bits_equal(obs["loss"], ref_loss),
        "changed": inj.changed(),
    }
    torch.manual_seed(30_000 + 7 * i + r.rank)
    out["follow"] = _public(r.step(r.guard, step + 1, r.batch(step + 1), None))
    return out


def _episode(r: _Rank, e: Episode, calls: Any, snap: list[torch.Tensor], states: tuple[Any, Any]) -> dict[str, Any]:
    st = r.plan.settings
    r.restore(snap)
    r.megatron.load_state_dict(states[1])
    inj = Injector(e.trial, r.rank, calls, rate=r.plan.rate)
    onset = e.start + e.phase
    seen: list[dict[str, list[int]]] = []
    effective = False
    for k in range(st.length):
        t = onset + k
        torch.manual_seed(40_000 + 7 * t + r.rank)
        batch = r.batch(t)
        active = inj if (k == 0 or e.trial.timing == "sticky") else None
        if k == 0:
            _, ref_reduced = r.reference(batch)
        obs = r.step(r.episode_guard, t, batch, active, hash_now=t % st.hash_every == 0)
        if k == 0:
            effective = not all_bits_equal(obs["reduced"], ref_reduced) or (
                e.trial.target == "weights" and inj.changed() > 0
            )
        named = sorted({s for kind, sus in obs["sdcguard"] if kind != "nondeterministic" for s in sus})
        seen.append(
            {
                "sdcguard": named,
                "megatron": [r.rank] if obs["megatron"] else [],
                "hash": obs["hash"],
                "same_device": [int(obs["same_device"][0]), int(obs["same_device"][1])],
            }
        )
    return {"effective": effective, "steps": seen, "changed": inj.changed()}


def rank_main(rank: int, world: int, plan: PeerPlan) -> dict[str, Any]:
    """Run on every rank by ``run_ranks``; returns this rank's observations."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    r = _Rank(rank, plan)
    out: dict[str, Any] = {"rank": rank}
    cal = r.guard.calibrate(r.batch(-1))
    out["calibrated"] = cal.deterministic
    out["clean"] = _clean(r, plan.clean_steps)
    snap = r.snapshot()
    states = (r.guard.state_dict(), r.megatron.state_dict())
    calls = count_op_calls(r.model, r.loss_fn, r.batch(0))
    out["op_calls"] = calls
    base = plan.clean_steps + 10
    t0 = time.monotonic()
    out["trials"] = [_trial(r, i, t, base + 2 * i, calls, snap, states) for i, t in enumerate(plan.trials)]
    out["trials_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    r.restore(snap)
    for step in range(3):  # the episode guard learns that replays agree on this setup before any fault
        r.step(r.episode_guard, 10**7 + step * plan.settings.replay_every, r.batch(step), None)
    ep_states = (r.episode_guard.state_dict(), states[1])
    out["episodes"] = [_episode(r, e, calls, snap, ep_states) for e in plan.episodes]
    out["episodes_s"] = time.monotonic() - t0
    r.guard.close()
    r.episode_guard.close()
    return out
