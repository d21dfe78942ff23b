"""One cell of the attribution matrix: a real job (gloo processes) in one replay mode, with a model that replays bit
for bit or not, a schedule of hardware faults on its devices, and ``guard.calibrate()`` called or not.

The schedule (``replay_every=1``, ``escalate="off"``: one long run per job, as a campaign runs it) puts every kind
of fault the matrix names into one run, so the guard's state carries from one fault to the next:

- a sticky fault on rank 1 present from the start (``calibrate()`` runs under it too), steps 0-1;
- a one-off on rank 0 at step 3;
- an intermittent fault (each op call hit with probability 0.5) on the last rank at steps 5-6;
- sticky faults on two devices at once (ranks 0 and 1, different bits) at step 8;
- sticky faults on two devices at different times: rank 1 at step 10, another rank at step 12;
- clean steps 13-14 (replay must still be on).

Each rank returns, per step: commit, the incidents, the checks that ran, and whether a fault touched its own
original computation of the step (counted between the forward and the guard's end of step).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

from sdcguard import SDCGuard, plan_roles
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from tests._nondeterministic import NoisyModel

SEQ = 4
STEPS = 15
CLEAN_TAIL = (13, 14)


def schedule(workers: int) -> dict[int, list[tuple[int, str, str]]]:
    """step -> [(rank, timing, bit)] (step -1: during calibrate)."""
    last, other = workers - 1, 2 if workers > 2 else 0
    sticky1 = [(1, "sticky", "high_mantissa")]  # mantissa bits: a dedicated shadow cannot veto, and an exponent
    # flip applied to the weights would make them inf/NaN, after which no fault changes anything
    return {
        -1: sticky1,
        0: sticky1,
        1: sticky1,
        3: [(0, "transient", "high_mantissa")],
        5: [(last, "intermittent", "high_mantissa")],
        6: [(last, "intermittent", "high_mantissa")],
        8: [(0, "sticky", "high_mantissa"), (1, "sticky", "sign")],
        10: sticky1,
        12: [(other, "sticky", "sign")],
    }


def faulty_at(workers: int, step: int) -> set[int]:
    return {r for r, _, _ in schedule(workers).get(step, [])}


def _modes(step: int, rank: int, workers: int, faults: bool) -> list[OpFaultMode]:
    out = []
    for r, timing, bit in schedule(workers).get(step, []) if faults else []:
        if r != rank:
            continue
        fault = Fault(
            pattern="bitflip",
            bit=bit,
            timing=timing,
            seed=1000 + step + 7 * r,
            rate=0.5 if timing == "intermittent" else 1.0,
        )
        mode = OpFaultMode(fault, ops="gelu", phase="forward", rank=r, steps=[step])
        mode.step = step
        out.append(mode)
    return out


def _model(kind: str, deterministic: bool, world: int, group: Any) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
    torch.manual_seed(0)
    inner = TinyTransformer(d=8, heads=2, seq=SEQ, layers=2) if deterministic else NoisyModel()
    hook = None
    blocks = inner.blocks if deterministic else inner.body.blocks
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(inner, mesh=mesh)
        return inner, inner, hook
    return DDP(inner, process_group=group), inner, hook


def cell(rank: int, world: int, kind: str, deterministic: bool, calibrate: bool, faults: bool) -> dict[str, Any]:
    """One rank of a cell; ``kind``: ``peer`` (DDP), ``shadow`` (DDP + one dedicated shadow: the last rank) or
    ``fsdp``."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    group, shadows, workers = None, "peer", world
    if kind == "shadow":
        roles = plan_roles(1)
        group, shadows, workers = roles.dp_group, list(roles.shadows), world - 1
        if roles.role == "shadow":
            torch.manual_seed(0)
            model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=2) if deterministic else NoisyModel()
            guard = SDCGuard(model, lm_loss, group=group, replay_every=1, shadows=shadows, escalate="off")
            return {"served": guard.serve()}
    model, inner, _ = _model(kind, deterministic, world, group)
    guard = SDCGuard(model, lm_loss, group=group, replay_every=1, shadows=shadows, weight_check_every=0, escalate="off")
    out: dict[str, Any] = {"steps": {}, "calibration": None}
    if calibrate:
        with contextlib.ExitStack() as stack:
            for m in _modes(-1, rank, workers, faults):
                stack.enter_context(m)
            report = guard.calibrate(make_batch(99, 0, seq=SEQ))
        out["calibration"] = (report.verdict, report.ranks_differing, report.deterministic)
    opt = torch.optim.SGD(inner.parameters(), lr=0.05)
    torch.manual_seed(100 + rank)
    for step in range(STEPS):
        modes = _modes(step, rank, workers, faults)
        with contextlib.ExitStack() as stack:
            for m in modes:
                stack.enter_context(m)
            batch = make_batch(step, rank, seq=SEQ)
            guard.begin_step(step)
            guard.before_forward(batch)
            loss = lm_loss(model, batch)
            guard.observe_loss(loss)
            loss.backward()
            touched = sum(len(m.records) for m in modes) > 0
            report = guard.end_step(loss=loss.detach())
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        out["steps"][step] = (
            report.commit,
            touched,
            report.checks,
            [(i.kind, i.step, i.suspect_ranks, i.sticky) for i in report.incidents],
        )
    closing = guard.close()
    out["closing"] = [(i.kind, i.step, i.suspect_ranks, i.sticky) for i in closing]
    out["state"] = guard.state_dict()["determinism"]["state"]
    out["workers"] = workers
    return out


def _run_steps(
    guard: SDCGuard, model: torch.nn.Module, inner: torch.nn.Module, rank: int, modes: dict[int, list[Any]], steps: int
) -> dict[str, Any]:
    """``steps`` guarded steps, entering ``modes[step]`` around each (the guard's end of step included); per step:
    commit, the checks, the incidents (as in :func:`cell`)."""
    opt = torch.optim.SGD(inner.parameters(), lr=0.05)
    out: dict[str, Any] = {"steps": {}}
    for step in range(steps):
        with contextlib.ExitStack() as stack:
            for m in modes.get(step, []):
                m.step = step
                stack.enter_context(m)
            batch = make_batch(step, rank, seq=SEQ)
            guard.begin_step(step)
            guard.before_forward(batch)
            loss = lm_loss(model, batch)
            guard.observe_loss(loss)
            loss.backward()
            report = guard.end_step(loss=loss.detach())
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        out["steps"][step] = (
            report.commit,
            report.checks,
            [(i.kind, i.step, i.suspect_ranks, i.sticky) for i in report.incidents],
        )
    out["state"] = guard.state_dict()["determinism"]["state"]
    guard.close()
    return out


MIXED_FAULTS = {1: (0, "sticky"), 2: (0, "sticky"), 4: (1, "transient"), 6: (2, "sticky")}
"""The mixed-setup cell's schedule: step -> (rank, timing). Rank 0 is the one device of setup A."""


def mixed_setup_cell(rank: int, world: int) -> dict[str, Any]:
    """Peer replay (DDP) on devices of two setups, A on rank 0 and B on the others (as mixed device models or
    drivers would give), with faults on the A device and on B devices: a strict majority of one setup against a
    lone device of the other names that device; nothing is software."""
    import sdcguard.training.identity as identity

    identity.setup_key = lambda device=None: ("setup-A",) if rank == 0 else ("setup-B",)  # what each reports
    torch.manual_seed(0)
    inner = TinyTransformer(d=8, heads=2, seq=SEQ, layers=2)
    model = DDP(inner)
    guard = SDCGuard(model, lm_loss, replay_every=1, weight_check_every=0, escalate="off")
    modes: dict[int, list[Any]] = {}
    for step, (r, timing) in MIXED_FAULTS.items():
        fault = Fault(pattern="bitflip", bit="high_mantissa", timing=timing, seed=2000 + step)
        modes[step] = [OpFaultMode(fault, ops="gelu", phase="forward", rank=r, steps=[step])]
    return _run_steps(guard, model, inner, rank, modes, 9)


class ReplayAllGatherFault(TorchDispatchMode):
    """Corrupts, once, what one rank sends into an FSDP2 all-gather while the guard replays (its copy-in buffer:
    ``fsdp.all_gather_copy_in``), so every rank's replay reads the corrupted shard at once, as a faulty link or NIC
    on that rank would make it; the originals and the settling reruns read clean all-gathers."""

    def __init__(self, guard: SDCGuard, rank: int) -> None:
        super().__init__()
        self.guard, self.rank, self.step = guard, rank, None
        self.hits = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if (
            str(func.overloadpacket) == "fsdp.all_gather_copy_in"
            and self.guard.replaying
            and torch.distributed.get_rank() == self.rank
            and not self.hits
        ):
            self.hits += 1
            sent = out[0].view(torch.int32) if out[0].dtype == torch.float32 else out[0]
            sent ^= 1 << 20  # a high mantissa bit of every value of this rank's shard (one value could be masked)
        return out


def replay_collective_cell(rank: int, world: int) -> dict[str, Any]:
    """FSDP2, one all-gather corrupted during the replay of step 2 (every replay wrong at once, every original
    right), then a sticky fault on rank 1 at step 4: the first is one unresolved shared-cause incident and a
    vetoed step, the second still names rank 1."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    model, inner, _ = _model("fsdp", True, world, None)
    guard = SDCGuard(model, lm_loss, replay_every=1, weight_check_every=0, escalate="off")
    sticky = Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=7)
    modes: dict[int, list[Any]] = {
        2: [ReplayAllGatherFault(guard, 0)],
        4: [OpFaultMode(sticky, ops="gelu", phase="forward", rank=1, steps=[4])],
    }
    out = _run_steps(guard, model, inner, rank, modes, 7)
    out["hits"] = modes[2][0].hits
    return out


def escalation(rank: int, world: int, escalate: str, steps: int) -> dict[str, Any]:
    """A sticky fault on rank 1 from step 2 on, at the guard's defaults (``replay_every=50``) but ``escalate``."""
    from sdcguard import CorruptionDetected

    torch.manual_seed(0)
    inner = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    guard = SDCGuard(DDP(inner), lm_loss, escalate=escalate)
    opt = torch.optim.SGD(inner.parameters(), lr=0.05)
    fault = OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5),
        ops="gelu",
        phase="forward",
        rank=1,
        steps=range(2, steps),
    )
    try:
        with fault:
            for step in range(steps):
                fault.step = step
                if guard.step(step, make_batch(step, rank, seq=SEQ)).commit:
                    opt.step()
                opt.zero_grad(set_to_none=True)
    except CorruptionDetected as e:
        return {"raised": step, "named": [(i.kind, i.suspect_ranks, i.sticky, i.device) for i in e.incidents]}
    except SystemExit as e:
        return {"exit": e.code, "at": step}
    return {"raised": None}


def shadow_escalation(rank: int, world: int, escalate: str) -> dict[str, Any]:
    """2 workers and 1 dedicated shadow (``plan_roles(1)``), a sticky fault on worker 1 from step 0, ``escalate``
    as given: every rank, the shadow included, raises or exits, and at the same point of the job."""
    from sdcguard import CorruptionDetected

    roles = plan_roles(1)
    torch.manual_seed(0)
    inner = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    try:
        if roles.role == "shadow":
            guard = SDCGuard(inner, lm_loss, group=roles.dp_group, replay_every=1, shadows=list(roles.shadows))
            return {"served": guard.serve()}
        guard = SDCGuard(
            DDP(inner, process_group=roles.dp_group),
            lm_loss,
            group=roles.dp_group,
            replay_every=1,
            shadows=list(roles.shadows),
            escalate=escalate,
        )
        opt = torch.optim.SGD(inner.parameters(), lr=0.05)
        fault = OpFaultMode(
            Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5), ops="gelu", phase="forward", rank=1
        )
        with fault:
            for step in range(20):
                fault.step = step
                if guard.step(step, make_batch(step, rank, seq=SEQ)).commit:
                    opt.step()
                opt.zero_grad(set_to_none=True)
        guard.close()
    except CorruptionDetected as e:
        return {"raised": [(i.kind, i.suspect_ranks, i.sticky) for i in e.incidents]}
    except SystemExit as e:
        return {"exit": e.code}
    return {"raised": None}


def fsdp_sync_kept(rank: int, world: int) -> list[bool]:
    """A sampled step of an FSDP2 loop whose user turned gradient sync off (accumulating) after the step: the
    replay turns it on for itself and puts the user's setting back."""
    from torch.distributed.fsdp import FSDPModule

    model, inner, _ = _model("fsdp", True, world, None)
    guard = SDCGuard(model, lm_loss, replay_every=1)
    batch = make_batch(0, rank, seq=SEQ)
    guard.begin_step(0)
    guard.before_forward(batch)
    loss = lm_loss(model, batch)
    guard.observe_loss(loss)
    loss.backward()
    model.set_requires_gradient_sync(False)  # the user's choice for the next micro-batches
    guard.end_step()
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    return [bool(g.reduce_grads) for m in modules for g in m._get_fsdp_state()._fsdp_param_groups]
