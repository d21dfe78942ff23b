"""Verified checkpoints: save what was checked, refuse what rotted, say where to roll back to.

In one process and with 3 ranks over gloo (DDP, FSDP2): a round trip is bit-identical; a changed byte in any saved
tensor's data raises ``CheckpointCorrupted`` naming its key (DCP alone loads it silently); bad checkpoints are one
clear error each; and a fault injected between two samples names the checkpoint saved before the fault could have
touched the weights.
"""

from __future__ import annotations

import json
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from sdcguard import CheckpointCorrupted, CheckpointError, SDCGuard, Store, checkpoint
from sdcguard.cli import cli
from sdcguard.errors import BadInput
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing import run_ranks
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from tests._checkpoints import flip_byte_of as _flip_byte_of
from tests._checkpoints import trained

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def _trained(steps: int = 3) -> tuple[TinyTransformer, torch.optim.Optimizer, SDCGuard]:
    return trained(steps)


def test_round_trip_is_bit_identical_and_a_rotted_byte_is_named(tmp_path: Path) -> None:
    model, opt, guard = _trained()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    info = checkpoint.save(state, checkpoint_id=tmp_path / "c", guard=guard)
    assert info.saved and info.verified and info.step == 2 and len(info.digest) == 16
    assert (tmp_path / "c" / checkpoint.SIDECAR).exists()

    fresh, fresh_opt, _ = _trained(1)
    target = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    loaded = checkpoint.load(target, checkpoint_id=tmp_path / "c")
    assert loaded.checked and loaded.digest == info.digest and loaded.verified
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    for a, b in zip(opt.state_dict()["state"].values(), fresh_opt.state_dict()["state"].values()):
        assert all(torch.equal(a[n], b[n]) for n in a)

    _flip_byte_of(tmp_path / "c", "model.blocks.0.fc1.weight")
    plain = {"model": _trained(1)[0].state_dict()}
    import torch.distributed.checkpoint as dcp

    dcp.load(plain, checkpoint_id=str(tmp_path / "c"))  # DCP alone: loads without a word
    assert not torch.equal(plain["model"]["blocks.0.fc1.weight"], model.state_dict()["blocks.0.fc1.weight"])
    with pytest.raises(CheckpointCorrupted, match=r"model\.blocks\.0\.fc1\.weight") as e:
        checkpoint.load({"model": _trained(1)[0].state_dict()}, checkpoint_id=tmp_path / "c")
    assert e.value.keys == ("model.blocks.0.fc1.weight",) and e.value.ranks == (0,)


@pytest.mark.parametrize("key", ["model.tok.weight", "model.pos", "model.head.bias", "optim.state.0.exp_avg"])
def test_a_changed_byte_in_any_saved_tensor_names_its_key(tmp_path: Path, key: str) -> None:
    model, opt, _ = _trained(2)
    checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=tmp_path / "c")
    _flip_byte_of(tmp_path / "c", key)
    m2, o2, _ = _trained(2)
    with pytest.raises(CheckpointCorrupted) as e:
        checkpoint.load({"model": m2.state_dict(), "optim": o2.state_dict()}, checkpoint_id=tmp_path / "c")
    assert e.value.keys == (key,)


def test_bad_checkpoints_are_one_clear_error_each(tmp_path: Path) -> None:
    model, _, guard = _trained(1)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        checkpoint.load(model.state_dict(), checkpoint_id=tmp_path / "missing")
    with pytest.raises(BadInput, match="checkpoint_id is required"):
        checkpoint.save(model.state_dict(), checkpoint_id="")
    checkpoint.save(model.state_dict(), checkpoint_id=tmp_path / "c")
    before = (tmp_path / "c" / checkpoint.SIDECAR).read_bytes()
    with pytest.raises(BadInput, match="already holds a checkpoint"):  # nothing overwritten
        checkpoint.save(_trained(2)[0].state_dict(), checkpoint_id=tmp_path / "c")
    assert (tmp_path / "c" / checkpoint.SIDECAR).read_bytes() == before

    import torch.distributed.checkpoint as dcp

    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path / "plain"))  # a DCP checkpoint without fingerprints
    with pytest.warns(RuntimeWarning, match="without sdcguard fingerprints"):
        info = checkpoint.load(_trained(1)[0].state_dict(), checkpoint_id=tmp_path / "plain")
    assert not info.checked
    with pytest.raises(CheckpointError, match="strict=True"):
        checkpoint.load(_trained(1)[0].state_dict(), checkpoint_id=tmp_path / "plain", strict=True)

    (tmp_path / "c" / checkpoint.SIDECAR).write_text('{"format": "sdcguard-checkpoint/1", "fingerp')
    with pytest.raises(CheckpointError, match="unreadable or truncated"):
        checkpoint.load(model.state_dict(), checkpoint_id=tmp_path / "c")
    (tmp_path / "c" / checkpoint.SIDECAR).write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not an sdcguard checkpoint record"):
        checkpoint.load(model.state_dict(), checkpoint_id=tmp_path / "c")

    data = next((tmp_path / "plain").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError, match="could not be read"):
        checkpoint.load(model.state_dict(), checkpoint_id=tmp_path / "plain")


def test_only_verified_states_are_saved_on_request(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyTransformer()
    guard = SDCGuard(model, lm_loss, replay_every=3)
    for s in range(5):  # samples at steps 0 and 3
        guard.step(s, make_batch(s, 0))
        model.zero_grad()
    assert guard.last_verified_step == 3
    info = checkpoint.save(model.state_dict(), checkpoint_id=tmp_path / "s4", guard=guard, only_verified=True)
    assert not info.saved and not (tmp_path / "s4").exists()
    info = checkpoint.save(model.state_dict(), checkpoint_id=tmp_path / "s3", guard=guard, step=3, only_verified=True)
    assert info.saved and info.verified


# ------------------------------------------------------------------------------------------- distributed


def _dist_job(rank: int, world: int, kind: str, root: str) -> dict[str, Any]:
    """Save every 2 steps, samples every 3; a sticky fault starts on rank 1 at step 7 (between the samples of
    steps 6 and 9) and is found at step 9: the restart is from the checkpoint of step 6."""
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=4, layers=2)
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        wrapped: torch.nn.Module = model
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model)
    guard = SDCGuard(wrapped, lm_loss, replay_every=3, on_detect="record", store=f"{root}/fleet.db")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    saved: dict[int, Any] = {}
    incidents: list[Any] = []
    fault = OpFaultMode(
        Fault(pattern="bitflip", bit="exponent", timing="sticky"),
        ops="gelu",
        phase="forward",
        rank=1,
        steps=range(7, 100),
    )
    for step in range(10):
        fault.step = step
        with fault if step >= 7 else nullcontext():
            report = guard.step(step, make_batch(step, rank, seq=4))
        incidents += [(i.kind, i.step, i.suspect_ranks, i.rollback) for i in report.incidents]
        if report.commit:
            opt.step()
        opt.zero_grad()
        if step % 2 == 0:
            info = checkpoint.save({"model": model.state_dict()}, checkpoint_id=f"{root}/step{step}", guard=guard)
            saved[step] = (info.verified, info.digest)
    # read back the step-6 checkpoint into a fresh model: bit-identical, on every rank
    torch.manual_seed(1)
    other = TinyTransformer(d=8, heads=2, seq=4, layers=2)
    if kind == "fsdp":
        for block in other.blocks:
            fully_shard(block)
        fully_shard(other)
    target = {"model": other.state_dict()}
    info = checkpoint.load(target, checkpoint_id=f"{root}/step6")
    reference = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in target["model"].items()}
    return {
        "saved": saved,
        "incidents": incidents,
        "last_verified": guard.last_verified_step,
        "loaded": (info.checked, info.step, info.verified),
        "local": {k: v.sum().item() for k, v in reference.items()},
    }


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_fault_between_samples_names_the_checkpoint_before_it(tmp_path: Path, kind: str) -> None:
    results = run_ranks(_dist_job, 3, kind, str(tmp_path), timeout=220)
    for res in results:
        # samples at steps 0, 3, 6, 9: checkpoints at 0 and 6 are verified when saved, 2, 4 and 8 are not
        assert {s: v for s, (v, _) in res["saved"].items()} == {0: True, 2: False, 4: False, 6: True, 8: False}
        replay = [i for i in res["incidents"] if i[0] == "replay"]
        assert replay and all(i[1] == 9 and i[2] == (1,) for i in replay)
        assert all(i[3] == f"{tmp_path}/step6" for i in replay)  # the fault may have started at step 7
        assert res["last_verified"] == 6  # nothing after the fault's earliest step is vouched for
        assert res["loaded"] == (True, 6, True)
    assert results[0]["saved"] == results[1]["saved"] == results[2]["saved"]  # one digest on every rank
    # the store holds each checkpoint once (the writer rank), and the incidents' restart point: a drill's store (the
    # job runs an injector), beside the fleet's, which holds none of the drill's records (the guard made it, empty,
    # before the injector existed)
    with Store.open(tmp_path / "fleet.db") as store:
        assert store.training.checkpoints() == [] and store.training.incidents() == []
    with Store.open(tmp_path / "fleet.drills.db") as store:
        recorded = store.training.checkpoints()
        stored = [i for i in store.training.incidents() if i.kind == "replay"]
    assert [(c.checkpoint_id, c.step, c.verified, c.digest) for c in recorded] == [
        (f"{tmp_path}/step{s}", s, v, d) for s, (v, d) in sorted(results[0]["saved"].items())
    ]
    assert stored and all(i.rollback == f"{tmp_path}/step6" for i in stored)
    shown = CliRunner().invoke(cli, ["--db", str(tmp_path / "fleet.drills.db"), "incidents", "--format", "json"])
    assert shown.exit_code == 0 and {i["rollback"] for i in json.loads(shown.output)} >= {f"{tmp_path}/step6"}
    shown = CliRunner().invoke(cli, ["--db", str(tmp_path / "fleet.drills.db"), "checkpoints", "--format", "json"])
    assert shown.exit_code == 0 and [c["verified"] for c in json.loads(shown.output)] == [
        True,
        False,
        False,
        True,
        False,
    ]
    if kind == "ddp":
        assert results[0]["local"] == results[1]["local"] == results[2]["local"]


def _rot_job(rank: int, world: int, root: str, key: str) -> Any:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    from torch.distributed.fsdp import fully_shard

    model = TinyTransformer(d=8, heads=2, seq=4, layers=2)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    checkpoint.save({"model": model.state_dict()}, checkpoint_id=f"{root}/c")
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        _flip_byte_of(Path(root) / "c", key, at=0)
    dist.barrier()
    try:
        checkpoint.load({"model": model.state_dict()}, checkpoint_id=f"{root}/c")
    except CheckpointCorrupted as e:
        return e.keys, e.ranks
    return None


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_fsdp2_shards_are_checked_by_the_rank_that_reads_them(tmp_path: Path) -> None:
    results = run_ranks(_rot_job, 3, str(tmp_path), "model.blocks.1.fc2.weight", timeout=180)
    assert all(r is not None for r in results) and len({repr(r) for r in results}) == 1  # every rank raises alike
    keys, ranks = results[0]
    assert len(keys) == 1 and keys[0].startswith("model.blocks.1.fc2.weight#") and len(ranks) == 1


# ---------------------------------------------------------------------------------------- framework hooks


def _flip_in_zip(file: Path) -> None:
    """Flip one bit in the raw bytes of the first tensor storage of a torch.save (zip) file."""
    import struct
    import zipfile

    blob = bytearray(file.read_bytes())
    entry = next(z for z in zipfile.ZipFile(file).infolist() if "/data/" in z.filename and z.file_size > 64)
    name_len, extra_len = struct.unpack("<HH", blob[entry.header_offset + 26 : entry.header_offset + 30])
    blob[entry.header_offset + 30 + name_len + extra_len + 17] ^= 0x10
    file.write_bytes(bytes(blob))


def test_lightning_checkpoints_are_recorded_and_a_rotted_file_is_refused(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    from sdcguard.adapters.lightning import SDCGuardCallback, SDCGuardCheckpointIO

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = TinyTransformer()

        def training_step(self, batch: Any, idx: int) -> torch.Tensor:
            return lm_loss(self.net, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    cb = SDCGuardCallback(replay_every=2)
    io = SDCGuardCheckpointIO(cb)
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb, saver],
        plugins=[io],
    )
    trainer.fit(Module(), torch.utils.data.DataLoader([make_batch(s, 0) for s in range(4)], batch_size=None))
    files = sorted(tmp_path.glob("*.ckpt"))
    assert len(files) == 2 and all(io.record_path(f).exists() for f in files)
    records = [json.loads(io.record_path(f).read_text()) for f in files]
    # samples at steps 0 and 2: the states after steps 1 and 3 are not vouched for when they are saved
    assert [(r["step"], r["verified"]) for r in records] == [(1, False), (3, False)]
    assert cb.guard is not None
    assert [c[:2] for c in cb.guard.state_dict()["verification"]["checkpoints"]] == [["step=2", 1], ["step=4", 3]]
    assert io.load_checkpoint(files[1])["global_step"] == 4
    _flip_in_zip(files[1])
    with pytest.raises(CheckpointCorrupted) as e:
        io.load_checkpoint(files[1])
    assert len(e.value.keys) == 1 and e.value.keys[0].startswith("state_dict.")


def test_hf_trainer_checkpoints_are_recorded_and_a_rotted_one_is_refused_on_resume(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate (the Trainer needs it) is not installed")
    from sdcguard.adapters.hf import RECORD, SDCGuardTrainerCallback

    config = transformers.GPT2Config(
        vocab_size=61, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    rows = [{"input_ids": make_batch(s, 0)["tokens"][0], "labels": make_batch(s, 0)["tokens"][0]} for s in range(16)]

    def train(resume: str | None) -> SDCGuardTrainerCallback:
        torch.manual_seed(0)
        cb = SDCGuardTrainerCallback(replay_every=2)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=4,
            per_device_train_batch_size=2,
            use_cpu=True,
            report_to=[],
            save_strategy="steps",
            save_steps=2,
            logging_strategy="no",
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=rows, callbacks=[cb]
        )
        trainer.train(resume_from_checkpoint=resume)
        return cb

    cb = train(None)
    folders = sorted(tmp_path.glob("checkpoint-*"))
    assert [f.name for f in folders] == ["checkpoint-2", "checkpoint-4"]
    assert all((f / RECORD).exists() for f in folders)
    assert cb.guard is not None
    assert [c[:2] for c in cb.guard.state_dict()["verification"]["checkpoints"]] == [
        [str(folders[0]), 1],
        [str(folders[1]), 3],
    ]
    train(str(folders[0]))  # a clean resume passes the check
    weights = folders[0] / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-100] ^= 0x10  # a rotted byte in the last tensor's data
    weights.write_bytes(bytes(blob))
    with pytest.raises(CheckpointCorrupted) as e:
        train(str(folders[0]))
    assert e.value.keys and all(k in str(e.value) for k in e.value.keys)  # tied weights are named together
