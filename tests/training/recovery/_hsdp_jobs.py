"""The HSDP recovery test's jobs on gloo ranks: 3 replicas x 2 shards with ``escalate="recover"`` and a sticky fault
on one rank, and the fault-free reference it must equal bit for bit: the same job without a guard, whose replica 1
leaves before a step and whose other ranks go on as a fresh 2 x 2 HSDP job (a new module, ``fully_shard`` over a new
mesh, a new optimizer) resumed from the local shards and optimizer state they held, by public torch APIs only."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from sdcguard import SDCGuard
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing.models import TinyTransformer, lm_loss
from tests.training.recovery._jobs import SEQ, _batch, train

STEPS = 6
SHAPE = (3, 2)
NAMES = ("replicate", "shard")


def _model(mesh: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _local(t: torch.Tensor) -> bytes:
    local = t.detach().to_local() if hasattr(t, "to_local") else t.detach()
    return bytes(local.numpy().tobytes())


def _final(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's local shards of the weights and of the optimizer's state."""
    state = opt.state_dict()["state"]
    return {
        "weights": [_local(p) for p in model.parameters()],
        "optimizer": {k: {n: _local(t) for n, t in v.items()} for k, v in state.items()},
    }


def recovering(
    rank: int,
    world: int,
    fault: tuple[int, int],
    min_replicas: int | None,
    names: tuple[str, str] = NAMES,
    shape: tuple[int, int] = SHAPE,
) -> dict[str, Any]:
    """A sticky GELU fault on rank ``fault[0]`` from step ``fault[1]`` on; how the rank ended (``names``: the mesh's
    dimension names, ``shape``: replicas x shards)."""
    from torch.distributed.device_mesh import init_device_mesh

    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    model, opt = _model(init_device_mesh("cpu", shape, mesh_dim_names=names))
    guard = SDCGuard(
        model,
        lm_loss,
        replay_every=2,
        weight_check_every=1,
        checksum_every=0,
        slow=None,
        optimizer=opt,
        escalate="recover",
        min_replicas=min_replicas,
    )
    injector = OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5),
        ops="gelu",
        phase="forward",
        rank=fault[0],
        steps=range(fault[1], STEPS),
    )
    resumes: list[tuple[int, int]] = []

    def before(step: int) -> contextlib.AbstractContextManager[object]:
        injector.step = step
        return injector if rank == fault[0] else contextlib.nullcontext()

    try:
        train(guard, opt, steps=STEPS, before=before, resumed=lambda step, resume: resumes.append((step, resume)))
        guard.close()
    except SystemExit as e:
        return {"exit": e.code}
    recovered = [(i.kind, i.suspect_ranks, i.recovered_step) for i in guard.incidents if i.recovered_step is not None]
    return {"data_rank": guard.data_rank, "resumes": resumes, "recovered": recovered, **_final(model, opt)}


def _resumed(model: torch.nn.Module, opt: torch.optim.Optimizer, mesh: Any) -> tuple[Any, Any]:
    """A fresh HSDP job over ``mesh`` holding what ``model`` and ``opt`` hold (this rank's shards)."""
    from torch.distributed.tensor import DTensor

    fresh, fresh_opt = _model(mesh)
    with torch.no_grad():
        for new, old in zip(fresh.parameters(), model.parameters(), strict=True):
            new.to_local().copy_(old.detach().to_local())
    params = list(fresh.parameters())
    state = opt.state_dict()
    for i, slots in state["state"].items():
        p = params[i]
        for name, t in list(slots.items()):
            if isinstance(t, DTensor):
                local = t.to_local().clone()
                slots[name] = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    fresh_opt.load_state_dict(state)
    return fresh, fresh_opt


def fault_free(
    rank: int, world: int, leaves_at: int, names: tuple[str, str] = NAMES, shape: tuple[int, int] = SHAPE
) -> dict[str, Any]:
    """No guard, no fault: ``shape`` (replicas x shards) until ``leaves_at``, then replica 1 (ranks 2, 3) leaves and
    the others go on as a fresh job of one replica fewer resumed from their state, data ranks numbered by place."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    model, opt = _model(init_device_mesh("cpu", shape, mesh_dim_names=names))
    rows = [list(range(i * shape[1], (i + 1) * shape[1])) for i in range(shape[0])]
    stay = [row for i, row in enumerate(rows) if i != 1]
    data_rank = rank
    for step in range(STEPS):
        if step == leaves_at:
            mesh = DeviceMesh("cpu", stay, mesh_dim_names=names)  # every rank creates its groups
            if rank in rows[1]:
                return {"role": "left"}
            model, opt = _resumed(model, opt, mesh)
            data_rank = [r for row in stay for r in row].index(rank)
        lm_loss(model, _batch(step, data_rank)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"data_rank": data_rank, **_final(model, opt)}


def recovered_and_reference(
    rank: int, world: int, leaves_at: int, names: tuple[str, str] = NAMES, shape: tuple[int, int] = SHAPE
) -> dict[str, Any]:
    """The fault-free reference (:func:`fault_free`, replica 1 leaving before ``leaves_at``), then the guarded job
    with a sticky fault on rank 2 from step 3 and ``min_replicas`` one replica fewer (:func:`recovering`), in the
    same processes: one start of the ranks for both."""
    import torch.distributed as dist

    reference = fault_free(rank, world, leaves_at, names, shape)
    dist.barrier()
    return {"reference": reference, "recovered": recovering(rank, world, (2, 3), shape[0] - 1, names, shape)}


def refusals(rank: int, world: int) -> list[str]:
    """What ``escalate="recover"`` says on two ranks to a tensor-parallel mesh and to FSDP2 without replicas."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from sdcguard.errors import BadInput
    from tests._tensor_parallel import TPNet, loss_fn

    tp = TPNet()
    tp_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_module(tp, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fsdp, fsdp_opt = _model(init_device_mesh("cpu", (2,), mesh_dim_names=("shard",)))
    said = []
    for model, loss, opt in [(tp, loss_fn, torch.optim.SGD(tp.parameters())), (fsdp, lm_loss, fsdp_opt)]:
        try:
            SDCGuard(model, loss, escalate="recover", optimizer=opt, min_replicas=1, replay_every=1)
            said.append("accepted")
        except BadInput as e:
            said.append(str(e))
    return said


def _restart_guard(shm: str) -> tuple[SDCGuard, Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    model, opt = _model(init_device_mesh("cpu", (2, 2), mesh_dim_names=NAMES))
    settings: dict[str, Any] = {"replay_every": 2, "weight_check_every": 0, "checksum_every": 0, "slow": None}
    guard = SDCGuard(model, lm_loss, optimizer=opt, escalate="recover", snapshot_dir=shm, **settings)
    return guard, model, opt


def first_hsdp_run(rank: int, world: int, shm: str, steps: int) -> dict[str, Any]:
    """2 replicas x 2 shards, ``steps`` clean steps, then the processes end without closing anything: the step of
    the verified snapshot left in shared memory and this rank's local state at the start of every step."""
    guard, model, opt = _restart_guard(shm)
    states = {}
    for step in range(steps):
        states[step] = _final(model, opt)
        guard.step(step, _batch(step, guard.data_rank))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"step": guard.snapshot_step, "states": states}


def restarted_hsdp(rank: int, world: int, shm: str, moved: str | None = None) -> dict[str, Any]:
    """A new job over the same folder (``moved``: rank 3 restarts on another node, whose shared memory is this
    empty folder): ``guard.restore()``, then this rank's local state."""
    guard, model, opt = _restart_guard(moved if moved is not None and rank == 3 else shm)
    restored = guard.restore()
    return {"source": restored.source, "step": restored.step, "state": _final(model, opt)}
