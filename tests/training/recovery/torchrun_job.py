"""A guarded job that torchrun starts (tests/training/recovery/test_torchrun.py): data-parallel ranks over gloo,
``escalate="recover"`` with ``snapshot_dir``, ``guard.restore()`` at the start, a sticky fault on rank FAULTY from
step 4 on, and the process of data rank 0 lost at step CRASH (``os._exit``, as a lost node ends it).

``torchrun ... torchrun_job.py OUT SHM MIN_REPLICAS FAULTY CRASH`` (``-1``: none): each rank appends JSON lines to
OUT/rank<R>.jsonl (how it restored; how it ended).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from sdcguard import SDCGuard  # noqa: E402
from sdcguard.inject.faults import Fault  # noqa: E402
from sdcguard.inject.torch_faults import OpFaultMode  # noqa: E402
from sdcguard.testing.models import lm_loss  # noqa: E402
from tests.training.recovery._jobs import STEPS, _batch, _model  # noqa: E402


def main(out: str, shm: str, min_replicas: int | None, faulty: int, crash: int) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model, opt = _model()
    guard = SDCGuard(
        DDP(model), lm_loss, replay_every=2, weight_check_every=0, checksum_every=0, slow=None, optimizer=opt,
        escalate="recover", min_replicas=min_replicas, snapshot_dir=shm,
    )  # fmt: skip
    restored = guard.restore()
    note = {"attempt": attempt, "restored": restored.source, "from": restored.step}
    fault = None if rank != faulty else OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=5), ops="gelu", phase="forward",
        rank=faulty, steps=range(4, STEPS),
    )  # fmt: skip
    step, resumes = restored.step or 0, []
    with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({**note, "ended": "started"}) + "\n")
    while step < STEPS:
        if step == crash and guard.data_rank == 0:
            with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
                f.write(json.dumps({**note, "ended": "lost", "step": step, "resumes": resumes}) + "\n")
            os._exit(1)
        if fault is not None:
            fault.step = step
        with fault if fault is not None else contextlib.nullcontext():
            report = guard.step(step, _batch(step, guard.data_rank))
        if report.resume_from is not None:
            resumes.append((step, report.resume_from))
            step = report.resume_from
            continue
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
    guard.close()
    with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({**note, "ended": "finished", "data_rank": guard.data_rank, "resumes": resumes}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    out, shm, least, faulty, crash = sys.argv[1:6]
    main(out, shm, int(least) if least != "-1" else None, int(faulty), int(crash))
