# torchrun --standalone --nproc-per-node 3 examples/fault_drill.py
"""A training fault drill: inject two faults a faulty GPU would make, and show what the guard found.

Three data-parallel ranks train a small MLP for 16 steps with the guard at ``replay_every=5``. Two faults are
injected, each at a step the guard checks:

- step 10, rank 1: one exponent bit flipped in one output of a matmul in the backward pass (a compute fault).
  Step 10 is a sampled step (10 % 5 == 0): a peer replays rank 1's micro-batch and compares its local gradients.
  A compute fault on a step that is neither replayed nor checksummed is invisible to every check; replay sees one
  step in ``replay_every`` and the matmul checksums one in ``checksum_every`` (off here, to show replay alone).
- step 13, rank 2: one exponent bit flipped in rank 2's copy of the all-reduced gradients (a faulty collective or
  memory). The cross-replica gradient check runs on every step, so step 13 needs no sampling.

Three ranks, so a majority names the faulty one (with two, both are suspects). Every rank prints what its
injectors did (``.drill.summary()``; an injector that injected nothing says why); rank 0 prints the guard's
incidents and exits 1 when the guard did not name and veto both faults.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sdcguard
from sdcguard.inject import Fault
from sdcguard.inject.torch_faults import CorruptingCommHook, OpFaultMode

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
model, optimizer = DDP(net), torch.optim.SGD(net.parameters(), lr=0.1)

flip = Fault(pattern="bitflip", bit="exponent", timing="transient", seed=7)
compute = OpFaultMode(flip, ops="matmul", phase="backward", rank=1, steps=[10])
collective = CorruptingCommHook(flip, rank=2, steps=[13])
model.register_comm_hook(None, collective)  # DDP's public seam: the usual all-reduce, then the fault


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


guard = sdcguard.SDCGuard(model, loss_fn, replay_every=5, checksum_every=0)
data = torch.Generator().manual_seed(rank)
vetoed = []
with compute:
    for step in range(16):
        compute.step = collective.step = step  # the injectors act at their steps only: tell them the step
        batch = (torch.randn(16, 32, generator=data), torch.randint(0, 4, (16,), generator=data))
        report = guard.step(step, batch)
        if report.commit:
            optimizer.step()
        else:
            vetoed.append(step)
        optimizer.zero_grad()
        guard.after_optimizer_step()
guard.close()

for injector in (compute, collective):
    if injector.drill.targeted_here():  # the rank it injects on says what it did (or why nothing)
        # one write of the whole line (print writes the text and the newline apart, and another rank's line can
        # land between them on the shared terminal)
        print(f"rank {rank}: {injector.drill.finish()}\n", end="", flush=True)
dist.barrier()
if rank == 0:
    print(f"guard: {len(guard.incidents)} incident(s); steps vetoed on every rank: {vetoed}")
    for i in guard.incidents:
        print(f"  step {i.step}: {i.kind}, suspect rank(s) {list(i.suspect_ranks)} ({i.device}): {i.detail}")
    found = {(i.step, i.suspect_ranks) for i in guard.incidents}
    caught = (10, (1,)) in found and (13, (2,)) in found and {10, 13} <= set(vetoed)
    print("the guard named and vetoed both faults" if caught else "MISSED: the guard did not catch both faults")
dist.destroy_process_group()
sys.exit(0 if rank != 0 or caught else 1)
