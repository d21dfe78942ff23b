"""SequenceParallel under data parallelism for the SP tests: :class:`tests._tensor_parallel.SPBlock` (torchtitan's
block plan: SequenceParallel norms, ``down`` a ``RowwiseParallel`` whose output is reduce-scattered over the
sequence, a vocabulary-parallel head under ``loss_parallel``) on a ``(dp, tp=2)`` mesh with FSDP2 over ``dp``,
trained with ``guard.step``. Faults at (rank, step), sticky for the step: rank ``r``'s ``down`` matmul, the partial
sum its reduce-scatter adds into the other rank's sequence shard too (``before-reduce-scatter``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from tests._tensor_parallel import SPBlock, sp_loss


def job(rank: int, world: int, dp: int, guarded: bool, fault: dict[str, Any] | None, steps: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    from sdcguard import SDCGuard
    from sdcguard.fingerprints import fingerprint
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode

    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = SPBlock()
    plan = {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "n1": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
        "n2": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(model, mesh["tp"], plan)
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = None
    if guarded:
        guard = SDCGuard(model, sp_loss, replay_every=1, checksum_every=0, escalate="off", train_context=loss_parallel)
    mode: Any = None
    if fault is not None:
        sticky = Fault(pattern="bitflip", bit="exponent", timing="sticky")
        # down's local matmul: the second addmm of the block's forward (up is the first), whose partial sum the
        # reduce-scatter adds into both ranks' shards of the sequence
        mode = OpFaultMode(
            sticky, ops="addmm", phase="forward", rank=fault["rank"], steps=[fault["step"]], occurrence=1
        )
    seen = []
    d = mesh.get_coordinate()[0]
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + d)
        batch = (torch.randint(0, 12, (2, 8), generator=g), torch.randint(0, 12, (2, 8), generator=g))
        if mode is not None:
            mode.step = step
        with mode if mode is not None else _Nothing():
            if guard is not None:
                report = guard.step(step, batch)
                seen.append((report.commit, [(i.kind, i.step, tuple(i.suspect_ranks)) for i in report.incidents]))
            else:
                with loss_parallel():
                    sp_loss(model, batch).backward()
        if guard is None or report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if guard is not None:
            guard.after_optimizer_step()
    return {"seen": seen, "fingerprints": [fingerprint(p) for p in model.parameters()]}


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
