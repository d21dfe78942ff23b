"""Continuous verification: 3 data-parallel workers and one dedicated shadow (``plan_roles(1)``), ``replay_every=1``.

Every step one worker's micro-batch goes to the shadow (samples rotate over the workers, so each worker is checked
one step in three); its verdict comes back at a later step, so an incident names a step that was already applied
(a shadow cannot veto). The every-step gradient check and the weight check (every step here) run on the workers
as in peer mode.

A trial puts a fault on worker ``r`` at a step whose sample is ``r``'s (``sampled``), or deliberately at one whose
sample is another worker's (``sampled=False``: the schedule's other side, measured), and follows it for
``W + 3`` steps without the fault: the verdict on the faulty step arrives, and ``r``'s next sample (step
``s + W``) shows whether the shadow sees what the fault left behind. The guard's state is not restored here (a
sample may be in flight at any time): trials are ordered by worker and a gap longer than the guard's 20-sample
window separates two workers' trials, so blame never moves between devices inside the window.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from .baselines import BucketTap, all_bits_equal
from .faults import Injector, Trial, count_op_calls
from .peer import BATCH, LR, MODEL

WORKERS = 3


@dataclass(frozen=True, kw_only=True)
class ShadowTrial:
    trial: Trial
    sampled: bool = True


@dataclass(frozen=True, kw_only=True)
class ShadowPlan:
    trials: tuple[ShadowTrial, ...]
    clean_steps: int = 200
    rate: float = 0.05


class _Worker:
    def __init__(self, rank: int, roles: Any, plan: ShadowPlan) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel as DDP

        from sdcguard import SDCGuard
        from sdcguard.testing.models import TinyTransformer, lm_loss

        self.rank, self.plan, self.loss_fn, self.allreduce = rank, plan, lm_loss, allreduce_hook
        torch.manual_seed(0)
        self.model = TinyTransformer(**MODEL)
        self.ddp = DDP(self.model, process_group=roles.dp_group)
        self.tap = BucketTap()
        self.ddp.register_comm_hook(roles.dp_group, self.tap)
        self.guard = SDCGuard(
            self.ddp,
            lm_loss,
            group=roles.dp_group,
            replay_every=1,
            weight_check_every=1,
            shadows=list(roles.shadows),
            on_detect="record",
            checksum_every=0,
        )  # the shadow's replay measured alone
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=LR)
        self.step_no = 0
        self.seen: list[tuple[str, int, list[int], int]] = []
        self.reference(self.batch(-2))  # DDP's bucket rebuild after its first backward

    def batch(self, step: int) -> Any:
        from sdcguard.testing.models import make_batch

        return make_batch(step, self.rank, batch=BATCH, seq=MODEL["seq"])

    def reference(self, batch: Any) -> list[torch.Tensor | None]:
        rng = torch.get_rng_state()
        for p in self.params:
            p.grad = None
        self.loss_fn(self.ddp, batch).backward()
        out = [None if p.grad is None else p.grad.clone() for p in self.params]
        for p in self.params:
            p.grad = None
        torch.set_rng_state(rng)
        return out

    def sample_owner(self) -> int:
        return int(self.guard.state_dict()["samples"]) % WORKERS

    def step(self, inj: Injector | None = None) -> list[torch.Tensor | None]:
        """One training step (the fault of ``inj`` on it); incidents go to ``self.seen``; the reduced gradients."""
        s = self.step_no
        self.step_no += 1
        torch.manual_seed(50_000 + 7 * s + self.rank)
        batch = self.batch(s)
        if inj is not None:
            inj.set_step(s)
            if inj.comm_hook is not None:
                self.tap.inner = inj.comm_hook
        with inj.unit() if inj is not None else nullcontext():
            self.guard.begin_step(s)
            self.guard.before_forward(batch)
            with inj.original() if inj is not None else nullcontext():
                loss = self.loss_fn(self.ddp, batch)
                self.guard.observe_loss(loss)
                loss.backward()
            if inj is not None:
                inj.after_backward(self.model, s)
            reduced = [None if p.grad is None else p.grad.clone() for p in self.params]
            report = self.guard.end_step(loss=loss.detach())
        self.tap.inner = self.allreduce
        self.opt.step()  # on_detect="record": every step commits (a shadow's verdict comes later anyway)
        self.opt.zero_grad(set_to_none=True)
        if inj is not None:
            inj.after_optimizer(self.model, s)
        found = [*report.incidents, *self.guard.after_optimizer_step()]
        self.seen += [(i.kind, i.step, list(i.suspect_ranks), s) for i in found]
        return reduced


def _trial(w: _Worker, st: ShadowTrial, calls: Any, snap: list[torch.Tensor]) -> dict[str, Any]:
    with torch.no_grad():
        for p, v in zip(w.params, snap):
            p.copy_(v)
    aligned = 0
    while (w.sample_owner() == st.trial.rank) != st.sampled:
        w.step()
        aligned += 1
    s = w.step_no
    torch.manual_seed(50_000 + 7 * s + w.rank)
    ref = w.reference(w.batch(s))
    inj = Injector(st.trial, w.rank, calls, rate=w.plan.rate)
    w.seen = []
    reduced = w.step(inj)
    effective = not all_bits_equal(reduced, ref) or (st.trial.target == "weights" and inj.changed() > 0)
    for _ in range(WORKERS + 3):
        w.step()
    return {"step": s, "effective": effective, "changed": inj.changed(), "incidents": list(w.seen), "aligned": aligned}


def rank_main(rank: int, world: int, plan: ShadowPlan) -> dict[str, Any]:
    """Run on every rank (3 workers + 1 shadow) by ``run_ranks``."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    from sdcguard import SDCGuard, plan_roles
    from sdcguard.testing.models import TinyTransformer, lm_loss

    roles = plan_roles(1)
    if roles.role == "shadow":
        torch.manual_seed(0)
        guard = SDCGuard(
            TinyTransformer(**MODEL), lm_loss, group=roles.dp_group, replay_every=1, shadows=list(roles.shadows)
        )
        return {"rank": rank, "served": guard.serve()}
    w = _Worker(rank, roles, plan)
    calls = count_op_calls(w.model, lm_loss, w.batch(0))
    t0 = time.monotonic()
    for _ in range(plan.clean_steps):
        w.step()
    clean = {"steps": plan.clean_steps, "incidents": list(w.seen), "seconds": time.monotonic() - t0}
    snap = [p.detach().clone() for p in w.params]
    trials = []
    t0 = time.monotonic()
    for st in plan.trials:  # faults on different workers follow one another: one long run
        trials.append(_trial(w, st, calls, snap))
    leftover = [(i.kind, i.step, list(i.suspect_ranks), w.step_no) for i in w.guard.close()]
    return {
        "rank": rank,
        "clean": clean,
        "trials": trials,
        "trials_s": time.monotonic() - t0,
        "leftover": leftover,
        "steps": w.step_no,
    }
