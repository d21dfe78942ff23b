"""An expert-parallel job for the EP tests: :class:`sdcguard.testing.moe.MoE` (4 experts, top-2 routing,
``all_to_all_single`` dispatch and combine) on a ``(dp, ep)`` mesh, ``ep=2``, the gradients reduced by the loop
(dense ones over every rank, each expert's over its data-parallel replicas), the guard making the four calls, faults
at (rank, step): the backward matmul of one rank's expert weight gradient (``dw``), one element of its expert
weight flipped in memory (``memory``). Each rank returns what it saw per step and its parameters' fingerprints."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tests._tensor_parallel import ShapeFault

EP = 2


def job(
    rank: int, world: int, guarded: bool, fault: dict[str, Any] | None, steps: int, starve: bool = False
) -> dict[str, Any]:
    """``fault``: ``{"kind": "dw" | "forward" | "memory", "rank": r, "step": s}`` (``dw``: the expert weight
    gradient, ``forward``: the rank's forward matmuls before the dispatch, both sticky for the whole step);
    ``starve``: the router sends every token to experts 0 and 1 (EP rank 0's), so EP rank 1's receive none."""
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import sdcguard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode, corrupt_weights_
    from sdcguard.testing.moe import D, H, MoE, moe_batch, moe_loss, reduce_moe_gradients

    dp = world // EP
    mesh = init_device_mesh("cpu", (dp, EP), mesh_dim_names=("dp", "ep"))
    torch.manual_seed(0)
    model = MoE(ep_mesh=mesh["ep"])
    if starve:
        with torch.no_grad():
            model.router.bias[2:] = -1e4  # experts 2 and 3 never among the top 2: a probability of exactly 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = None
    if guarded:
        guard = sdcguard.SDCGuard(
            model, moe_loss, mesh=mesh, replay_every=1, checksum_every=0, weight_check_every=1, escalate="off"
        )
    mode: Any = None
    if fault is not None and fault["kind"] == "dw":
        mode = ShapeFault((D, H), fault["rank"], fault["step"], None)
    elif fault is not None and fault["kind"] == "forward":
        sticky = Fault(pattern="bitflip", bit="exponent", timing="sticky")
        mode = OpFaultMode(sticky, ops="addmm", phase="forward", rank=fault["rank"], steps=[fault["step"]])
    seen: list[dict[str, Any]] = []
    for step in range(steps):
        if fault is not None and fault["kind"] == "memory" and step == fault["step"]:
            flip = Fault(pattern="bitflip", bit=30, elements=1, seed=7)
            corrupt_weights_(model, flip, rank=fault["rank"], names="w1")
        batch = moe_batch(step, rank)  # every rank its own batch: EP ranks are data-parallel for the dense layers
        if mode is not None:
            mode.step = step
        with mode if mode is not None else _Nothing():
            if guard is not None:
                guard.begin_step(step)
                guard.before_forward(batch)
            loss = moe_loss(model, batch)
            if guard is not None:
                guard.observe_loss(loss)
            loss.backward()
            reduce_moe_gradients(model, None, mesh["dp"].get_group(), world)
            report = guard.end_step() if guard is not None else None
        commit = report is None or report.commit
        if commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None and report is not None:
            weights = guard.after_optimizer_step()
            said = [(i.kind, i.step, tuple(i.suspect_ranks)) for i in (*report.incidents, *weights)]
            words = [i.detail for i in report.incidents if i.kind == "unresolved"]
            seen.append({"commit": commit, "checks": report.checks, "incidents": said, "unresolved": words})
    dist.barrier()
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in model.parameters()]}


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def plain_experts(rank: int, world: int) -> dict[str, str]:
    """Ranks building :class:`~sdcguard.testing.moe.MoE` with no mesh, each way: ``experts`` (each rank its own
    experts, the dense layers alike), ``all`` (an unseeded model: every parameter differs) and ``none``; and
    ``step``: DTensor experts on a ``(dp, ep=1)`` mesh trained through ``guard.step``. Returns the guard's refusal, or
    ``"accepted"``, for each."""
    warnings.filterwarnings("ignore")
    import sdcguard
    from sdcguard.errors import BadInput
    from sdcguard.testing.moe import MoE, moe_batch, moe_loss

    said = {}
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "ep"))
    torch.manual_seed(0)
    meshed = MoE(ep_mesh=mesh["ep"])
    try:  # DTensor experts on a mesh with data-parallel replicas: guard.step would wrap them in DDP
        sdcguard.SDCGuard(meshed, moe_loss, mesh=mesh, replay_every=1).step(0, moe_batch(0, rank))
        said["step"] = "accepted"
    except BadInput as e:
        said["step"] = str(e)
    for differ in ("experts", "all", "none"):
        torch.manual_seed(rank if differ == "all" else 0)
        model = MoE()
        if differ == "experts":
            with torch.no_grad():
                model.w1.add_(rank)
                model.w2.add_(rank)
        try:
            sdcguard.SDCGuard(model, moe_loss, replay_every=1).close()
            said[differ] = "accepted"
        except BadInput as e:
            said[differ] = str(e)
    return said
