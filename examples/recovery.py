# python examples/recovery.py
"""A recovery drill with a hot spare: three workers and one dedicated shadow; a sticky fault on worker 1 from step 6.

The guard runs with ``escalate="recover"``: a sample names worker 1 sticky, every rank rolls back to the last
verified snapshot in host memory, worker 1 leaves with exit status 86, the shadow is promoted into the re-formed
data-parallel group and the loop goes on at ``report.resume_from``, every rank feeding the batches of
``guard.data_rank``. The script starts its four ranks itself (``multiprocessing``, one gloo group through a file
store): under ``torchrun`` a rank that exits makes torchrun stop the others (docs/recovery.md).
"""

import multiprocessing
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sdcguard
from sdcguard.inject import Fault
from sdcguard.inject.torch_faults import OpFaultMode

STEPS, FAULTY, FAULT_FROM = 14, 1, 6


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def batch_of(step, data_rank):  # a function of the step and the data rank: a recovery feeds the same batches again
    g = torch.Generator().manual_seed(1000 * step + data_rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)


def train(rank, store_path):
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, 4)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=4)
    roles = sdcguard.plan_roles(num_shadows=1)  # ranks 0-2 train, rank 3 is the spare
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)  # the spare builds one too: it may be promoted
    model = DDP(net, process_group=roles.dp_group) if roles.role == "worker" else net
    guard = sdcguard.SDCGuard(
        model,
        loss_fn,
        group=roles.dp_group,
        shadows=list(roles.shadows),
        replay_every=1,
        optimizer=optimizer,
        escalate="recover",
        checksum_every=0,
    )
    step = 0
    if roles.role == "shadow":
        guard.serve()  # returns when the workers close, or when a recovery promotes this rank
        if guard.role != "worker":
            print(f"rank {rank}: stayed a shadow")
            return
        step = guard.resume_from
        print(f"rank {rank}: promoted to a worker at step {step}, data rank {guard.data_rank}")
    fault = OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=3),
        ops="gelu",
        phase="forward",
        rank=FAULTY,
        steps=range(FAULT_FROM, STEPS),
    )
    while step < STEPS:
        fault.step = step
        with fault:
            report = guard.step(step, batch_of(step, guard.data_rank))
        if report.resume_from is not None:  # restored: go on at that step, with this rank's data rank's batches
            print(f"rank {rank}: recovered at {step}, going on at {report.resume_from} as data rank {guard.data_rank}")
            step = report.resume_from
            continue
        if report.commit:
            optimizer.step()
        optimizer.zero_grad()
        guard.after_optimizer_step()
        step += 1
    guard.close()
    lost = [(i.steps_lost, i.replacement_device) for i in guard.incidents if i.recovered_step is not None]
    print(f"rank {rank}: finished {STEPS} steps as data rank {guard.data_rank}; recovery: {lost}")
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        ranks = [ctx.Process(target=train, args=(r, os.path.join(tmp, "store"))) for r in range(4)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(timeout=300)
    codes = [p.exitcode for p in ranks]
    print(f"exit codes: {codes}")
    sys.exit(0 if codes == [0, 86, 0, 0] else 1)
