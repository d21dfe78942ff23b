"""The jobs the restart tests run on gloo ranks: a guarded run with ``snapshot_dir=`` that stops (as a crash or a
launcher's restart would end it), and the restarted job that goes on from what survived."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from sdcguard import SDCGuard, checkpoint
from sdcguard.testing.models import lm_loss
from sdcguard.training.recovery.snapshot import snapshot_fingerprints
from sdcguard.training.recovery.state import LiveState, state_digest
from tests.training.recovery._jobs import _batch, _model


def _guard(shm: str) -> tuple[SDCGuard, Any, Any]:
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    model, opt = _model()
    guard = SDCGuard(
        DDP(model), lm_loss, replay_every=2, weight_check_every=0, checksum_every=0, slow=None, optimizer=opt,
        escalate="recover", snapshot_dir=shm,
    )  # fmt: skip
    return guard, model, opt


def _digest(model: Any, opt: Any) -> int:
    skeleton, live = LiveState(model, opt).read()
    return state_digest(snapshot_fingerprints(live), skeleton)


def first_run(rank: int, world: int, shm: str, disk: str, steps: int) -> dict[str, Any]:
    """``steps`` clean steps with a verified checkpoint on disk after step 2, then the processes end without
    closing anything. Returns the step of the verified snapshot left in shared memory and the digest of the live
    state at the start of every step."""
    guard, model, opt = _guard(shm)
    digests = {}
    for step in range(steps):
        digests[step] = _digest(model, opt)
        guard.step(step, _batch(step, guard.data_rank))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 2:
            msd, osd = get_state_dict(model, opt)
            checkpoint.save({"model": msd, "optim": osd}, checkpoint_id=f"{disk}/2", guard=guard)
    return {"step": guard.snapshot_step, "digests": digests}


def restarted(rank: int, world: int, shm: str, disk: str, moved: str | None = None) -> dict[str, Any]:
    """A new job over the same folder: ``guard.restore`` with a fallback to the disk checkpoint (``moved``: rank 1
    restarts on another node, whose shared memory is this empty folder)."""
    guard, model, opt = _guard(moved if moved is not None and rank == 1 else shm)

    def from_disk() -> int:
        msd, osd = get_state_dict(model, opt)  # the optimizer's state allocated, for DCP to load into
        state = {"model": msd, "optim": osd}
        info = checkpoint.load(state, checkpoint_id=disk, fallback=True)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert info.step is not None
        return info.step + 1

    restored = guard.restore(fallback=from_disk)
    return {
        "source": restored.source, "step": restored.step, "detail": restored.detail,
        "resume_from": guard.resume_from, "live": _digest(model, opt),
    }  # fmt: skip


def corrupt_every_snapshot(shm: str) -> int:
    """Flip one bit in the slot every published record names (memory gone bad under a kept snapshot)."""
    import json

    flipped = 0
    for record in Path(shm).glob("rank*.json"):
        r = json.loads(record.read_text())
        slot = Path(shm) / f"rank{r['rank']}.slot{r['slot']}"
        data = bytearray(slot.read_bytes())
        data[3] ^= 0x10
        slot.write_bytes(bytes(data))
        flipped += 1
    return flipped
