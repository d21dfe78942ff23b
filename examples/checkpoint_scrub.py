# torchrun --standalone --nproc-per-node 2 examples/checkpoint_scrub.py
"""A verified checkpoint, a scrub at rest, and a load that falls back past a corrupted one.

Two DDP ranks train with the guard and save a checkpoint at steps 10 and 15 (``sdcguard.checkpoint.save``:
DCP's own layout, plus the fingerprint of every tensor taken before DCP copies it). Both are sampled steps
(``replay_every=5``), so the guard's checks vouch for them: ``verified``. Then rank 0 flips one bit in
the newer checkpoint's data file, as a bad disk would, and scrubs both (what ``sdcguard scrub DIR`` does from cron:
re-read every tensor against its fingerprint): the older is clean, the newer corrupt with the tensor named. Every
rank then loads with ``fallback=True``: the newest checkpoint that is verified and still reads back right.
The checkpoints land in ./sdcguard-example-ckpt (replaced on each run).
"""

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sdcguard
from sdcguard import checkpoint

dist.init_process_group("gloo")
rank = dist.get_rank()
root = Path("sdcguard-example-ckpt").absolute()
if rank == 0:
    shutil.rmtree(root, ignore_errors=True)
dist.barrier()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
model, optimizer = DDP(net), torch.optim.SGD(net.parameters(), lr=0.1)


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


guard = sdcguard.SDCGuard(model, loss_fn, replay_every=5)
data = torch.Generator().manual_seed(rank)
for step in range(20):
    batch = (torch.randn(16, 32, generator=data), torch.randint(0, 4, (16,), generator=data))
    if guard.step(step, batch).commit:
        optimizer.step()
    optimizer.zero_grad()
    guard.after_optimizer_step()
    if step in (10, 15):
        state = {"model": net.state_dict(), "optim": optimizer.state_dict()}
        info = checkpoint.save(state, checkpoint_id=root / f"step{step}", guard=guard)
        if rank == 0:
            print(f"saved {info.checkpoint_id}: step {info.step}, verified {info.verified}, {info.tensors} tensors")
guard.close()

if rank == 0:
    data_file = sorted((root / "step15").glob("*.distcp"))[0]
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0x04  # one flipped bit at rest
    data_file.write_bytes(bytes(raw))
    for result in checkpoint.scrub([root]):
        print(f"scrub: {result.status:7} {Path(result.checkpoint_id).name} {result.detail}")
dist.barrier()
state = {"model": net.state_dict(), "optim": optimizer.state_dict()}
loaded = checkpoint.load(state, checkpoint_id=root, fallback=True)
print(f"rank {rank}: loaded {Path(loaded.checkpoint_id).name}, passing over {len(loaded.skipped)} newer checkpoint(s)")
dist.destroy_process_group()
