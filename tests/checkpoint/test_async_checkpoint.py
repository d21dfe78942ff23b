"""Asynchronous verified checkpoints: the training loop continues while DCP writes; what was written is what the
device held, and a save that fails in the background is reported, recorded as failed, and never verified.

In one process (a guard on the tiny transformer) and on 3 gloo ranks: a round trip through ``async_save`` is
bit-identical and verified once settled; a host copy damaged while staging stops the write on every rank, naming
the tensor; a write into a full device (``/dev/full``) or a read-only directory is reported, recorded in the fleet
store as ``failed``, and never named as a place to roll back to.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

from sdcguard import SDCGuard, Store, checkpoint
from sdcguard.checkpoint.scrub import scrub_one
from sdcguard.cli import cli
from sdcguard.errors import BadInput
from sdcguard.testing import run_ranks
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from tests._logs import expect_log

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _train(model: torch.nn.Module, guard: SDCGuard, opt: torch.optim.Optimizer, steps: range, rank: int = 0) -> None:
    for s in steps:
        if guard.step(s, make_batch(s, rank)).commit:
            opt.step()
        opt.zero_grad()
        guard.after_optimizer_step()


def _setup(tmp_path: Path, replay_every: int = 1) -> tuple[TinyTransformer, torch.optim.Optimizer, SDCGuard]:
    torch.manual_seed(0)
    model = TinyTransformer()
    guard = SDCGuard(model, lm_loss, replay_every=replay_every, store=tmp_path / "fleet.db")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), guard


class DamagingStager(AsyncStager):
    """Stages like DCP, then flips one bit of ``key`` in the host copy: a corrupt device-to-host copy."""

    _synchronize_after_execute = False

    def __init__(self, key: str) -> None:
        self.inner = DefaultStager(StagingOptions(False, False, False, False))
        self.key = key

    def stage(self, state_dict: Any) -> Any:
        staged = self.inner.stage(state_dict)
        outer, inner = self.key.split(".", 1)
        staged[outer][inner].view(-1).view(torch.int32)[0] ^= 1 << 4
        return staged

    def close(self) -> None:
        self.inner.close()


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """A directory nobody may create files in, root included (``chattr +i``), else by its mode."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
            pytest.skip("running as root without chattr +i: no way to make a read-only directory")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o500)
        try:
            yield
        finally:
            path.chmod(0o700)


def test_an_async_save_round_trips_and_is_verified_when_settled(tmp_path: Path) -> None:
    model, opt, guard = _setup(tmp_path)
    _train(model, guard, opt, range(3))
    saver = checkpoint.AsyncCheckpointer()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    response = saver.save(state, checkpoint_id=tmp_path / "s2", guard=guard)
    assert hasattr(response, "staging_completion") and hasattr(response, "upload_completion")  # DCP's own object
    _train(model, guard, opt, range(3, 5))  # the loop goes on while DCP writes: the checkpoint keeps step 2
    assert saver.in_flight
    info = saver.wait()
    assert info is not None and info.saved and info.error is None and info.step == 2 and info.verified
    record = json.loads((tmp_path / "s2" / checkpoint.SIDECAR).read_text())
    assert record["verified"] is True and record["digest"] == info.digest
    assert scrub_one(tmp_path / "s2").status == "clean"  # the rewritten record still checks itself and the index
    assert [c[:3] for c in guard.state_dict()["verification"]["checkpoints"]] == [[str(tmp_path / "s2"), 2, True]]
    with Store.open(tmp_path / "fleet.db") as store:
        assert [(c.checkpoint_id, c.step, c.verified, c.status) for c in store.training.checkpoints()] == [
            (str(tmp_path / "s2"), 2, True, "saved")
        ]

    fresh = TinyTransformer()
    loaded = checkpoint.load({"model": fresh.state_dict()}, checkpoint_id=tmp_path / "s2")
    assert loaded.verified and loaded.step == 2
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())
    saver.close()


def test_at_most_one_save_is_in_flight(tmp_path: Path) -> None:
    model, opt, guard = _setup(tmp_path)
    _train(model, guard, opt, range(2))
    saver = checkpoint.AsyncCheckpointer()
    first = saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "a", guard=guard)
    _train(model, guard, opt, range(2, 3))
    saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "b", guard=guard)
    assert first.upload_completion.done()  # the second save waited for the first, and settled it
    assert [i.checkpoint_id for i in saver.settled] == [str(tmp_path / "a")]
    assert saver.close() is not None and [i.step for i in saver.settled] == [1, 2]
    with pytest.raises(BadInput, match="already holds a checkpoint"):
        saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "a")


def test_a_state_saved_before_its_step_was_sampled_is_verified_only_if_the_guard_vouches_when_settled(
    tmp_path: Path,
) -> None:
    model, opt, guard = _setup(tmp_path, replay_every=3)
    _train(model, guard, opt, range(2))  # sampled at step 0 only
    saver = checkpoint.AsyncCheckpointer()
    saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "s1", guard=guard)
    info = saver.wait()  # settled before the sample of step 3
    assert info is not None and info.saved and info.verified is False
    assert json.loads((tmp_path / "s1" / checkpoint.SIDECAR).read_text())["verified"] is False
    saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "s1b", guard=guard, step=1)
    _train(model, guard, opt, range(2, 4))  # the sample of step 3 vouches for steps up to 3
    info = saver.wait()
    assert info is not None and info.verified is True


def test_a_damaged_host_copy_stops_the_write_and_names_the_tensor(tmp_path: Path) -> None:
    model, opt, guard = _setup(tmp_path)
    _train(model, guard, opt, range(2))
    saver = checkpoint.AsyncCheckpointer(stager=DamagingStager("model.blocks.0.fc1.weight"))
    saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "c", guard=guard)
    with expect_log(r"failed .*model\.blocks\.0\.fc1\.weight"):
        info = saver.wait()
    assert info is not None and not info.saved and info.verified is False
    assert "host copy staged" in (info.error or "")
    assert not (tmp_path / "c" / ".metadata").exists() and not (tmp_path / "c" / checkpoint.SIDECAR).exists()
    assert guard.state_dict()["verification"]["checkpoints"] == []  # never a place to roll back to
    with Store.open(tmp_path / "fleet.db") as store:
        [row] = store.training.checkpoints()
    assert row.status == "failed" and not row.verified and "fc1.weight" in row.detail


@pytest.mark.parametrize("where", ["full", "read-only"])
def test_a_background_write_that_fails_is_reported_and_never_verified(tmp_path: Path, where: str) -> None:
    model, opt, guard = _setup(tmp_path)
    _train(model, guard, opt, range(2))
    target = tmp_path / "c"
    saver = checkpoint.AsyncCheckpointer()
    with contextlib.ExitStack() as stack:
        if where == "full":
            target.mkdir()
            (target / "__0_0.distcp").symlink_to("/dev/full")  # the data file DCP writes lands on a full device
        else:
            stack.enter_context(read_only(target))
        saver.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=target, guard=guard)
        with expect_log("asynchronous save of .* failed"):
            info = saver.wait()
    assert info is not None and not info.saved and info.verified is False and info.error
    assert not (target / checkpoint.SIDECAR).exists() and not (target / ".metadata").exists()
    assert guard.state_dict()["verification"]["checkpoints"] == []
    with Store.open(tmp_path / "fleet.db") as store:
        [row] = store.training.checkpoints()
    assert (row.checkpoint_id, row.status, row.verified) == (str(target), "failed", False) and row.detail
    assert row.job == guard.job  # listed with the job's other checkpoints (sdcguard checkpoints --job)
    shown = CliRunner().invoke(cli, ["--db", str(tmp_path / "fleet.db"), "checkpoints"])
    assert shown.exit_code == 0 and "failed:" in shown.output
    # the next save is not blocked by the failure
    saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "next", guard=guard)
    ok = saver.close()
    assert ok is not None and ok.saved and ok.verified


@pytest.mark.parametrize(("run_id", "slurm", "job"), [("none", None, None), ("none", "77", "77"), ("r-1", "77", "r-1")])
def test_a_save_without_a_guard_records_the_job_by_the_guards_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str, slurm: str | None, job: str | None
) -> None:
    """The async checkpointer had its own copy of the job-id rule and recorded torchrun's placeholder ``"none"`` as
    the job, which the guard does not take for an id."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    if slurm is None:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    else:
        monkeypatch.setenv("SLURM_JOB_ID", slurm)
    model = TinyTransformer(d=8, heads=2, layers=1, seq=4)
    saver = checkpoint.AsyncCheckpointer()
    saver.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "c", store=tmp_path / "fleet.db", step=3)
    assert saver.close() is not None
    with Store.open(tmp_path / "fleet.db") as store:
        [row] = store.training.checkpoints()
    assert row.job == job


def test_the_module_level_async_save(tmp_path: Path) -> None:
    model, opt, guard = _setup(tmp_path)
    _train(model, guard, opt, range(1))
    checkpoint.async_save({"model": model.state_dict()}, checkpoint_id=tmp_path / "m", guard=guard)
    info = checkpoint.async_wait()
    assert info is not None and info.verified and checkpoint.async_wait() is None


def test_a_store_gone_wrong_in_the_one_pass_host_copy_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default stager of a host-memory state copies and fingerprints in one pass; a bit that lands wrong in the
    copy (after the words were summed) is found by the background check of the staged copy."""
    from sdcguard.checkpoint import staging

    copy = staging.copy_and_fingerprint

    def copy_then_flip(sources: Any, destinations: Any) -> list[int]:
        values = copy(sources, destinations)
        destinations[0].view(-1).view(torch.uint8)[3] ^= 1 << 6  # the first tensor's copy: its sign bit
        return values

    model, opt, guard = _setup(tmp_path)
    _train(model, guard, opt, range(2))
    saver = checkpoint.AsyncCheckpointer()
    state = {"model": model.state_dict()}
    assert staging.HostStager.takes(state)  # the one-pass path, not DCP's stager
    monkeypatch.setattr(staging, "copy_and_fingerprint", copy_then_flip)
    saver.save(state, checkpoint_id=tmp_path / "c", guard=guard)
    first = next(iter(state["model"]))
    with expect_log(rf"failed .*model\.{first}"):
        info = saver.wait()
    assert info is not None and not info.saved and "host copy staged" in (info.error or "")
    assert not (tmp_path / "c" / ".metadata").exists()
    monkeypatch.setattr(staging, "copy_and_fingerprint", copy)  # the same checkpointer, its buffers reused: clean
    saver.save(state, checkpoint_id=tmp_path / "d", guard=guard)
    info = saver.close()
    assert info is not None and info.saved and scrub_one(tmp_path / "d").status == "clean"


# ------------------------------------------------------------------------------------------- distributed


def _dist_job(rank: int, world: int, root: str, fail: str | None) -> dict[str, Any]:
    """DDP on 3 ranks, sampled every step; async saves at steps 1 and 3, settled by poll() after each step. With
    ``fail="write"``, rank 1's data file of the step-3 checkpoint lands on a full device; with ``fail="stage"``,
    rank 1's host copy of it is damaged."""
    warnings.filterwarnings("ignore")
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=4, layers=1)
    guard = SDCGuard(DDP(model), lm_loss, replay_every=1, store=f"{root}/fleet.db")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    saver = checkpoint.AsyncCheckpointer()
    damaged = checkpoint.AsyncCheckpointer(stager=DamagingStager("model.blocks.0.fc1.weight"))
    polled: list[int] = []
    for step in range(6):
        report = guard.step(step, make_batch(step, rank, seq=4))
        if report.commit:
            opt.step()
        opt.zero_grad()
        guard.after_optimizer_step()
        if step in (1, 3):
            path = Path(root) / f"step{step}"
            if step == 3 and rank == 1 and fail == "write":
                path.mkdir(parents=True, exist_ok=True)
                (path / f"__{rank}_0.distcp").symlink_to("/dev/full")
            if step == 3 and fail == "stage":  # every rank switches (a collective); only rank 1's copy is damaged
                saver.close()
                saver = damaged if rank == 1 else checkpoint.AsyncCheckpointer()
            saver.save({"model": model.state_dict()}, checkpoint_id=path, guard=guard)
        info = saver.poll()  # settles once every rank's write finished, the same step on every rank
        if info is not None:
            polled.append(step)
    saver.close()
    return {
        "settled": [(i.step, i.verified, i.saved) for i in saver.settled],
        "errors": [i.error for i in saver.settled if i.error],
        "polled": polled,
        "notes": [c[:3] for c in guard.state_dict()["verification"]["checkpoints"]],
    }


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fail", [None, "write", "stage"])
def test_ranks_agree_on_async_saves_without_touching_the_training_group(tmp_path: Path, fail: str | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run_ranks(_dist_job, 3, str(tmp_path), fail, timeout=220)
    ok3 = fail is None
    if fail == "stage":  # the step-1 save settled on the first checkpointer, the step-3 one on the second
        for r in results:
            assert r["settled"] == [(3, False, False)] and "fc1.weight (rank 1)" in r["errors"][0]
            r["settled"] = [(1, True, True), *r["settled"]]
            r["errors"] = []
    assert results[0] == results[1] == results[2]  # every rank settled the same saves the same way
    assert results[0]["settled"] == [(1, True, True), (3, ok3, ok3)]
    assert results[0]["notes"] == [[f"{tmp_path}/step1", 1, True]] + ([[f"{tmp_path}/step3", 3, True]] if ok3 else [])
    with Store.open(tmp_path / "fleet.db") as store:
        rows = [(c.checkpoint_id, c.step, c.verified, c.status) for c in store.training.checkpoints()]
    assert rows == [
        (f"{tmp_path}/step1", 1, True, "saved"),
        (f"{tmp_path}/step3", 3, ok3, "saved" if ok3 else "failed"),
    ]
    if ok3:
        fresh = TinyTransformer(d=8, heads=2, seq=4, layers=1)
        assert checkpoint.load({"model": fresh.state_dict()}, checkpoint_id=tmp_path / "step3").verified


# ---------------------------------------------------------------------------------------------- Lightning


def test_lightning_model_parallel_checkpoints_are_saved_asynchronously_and_verified(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning.pytorch", reason="lightning is not installed")
    from sdcguard.adapters.lightning import SDCGuardCallback, SDCGuardModelParallelStrategy

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = TinyTransformer()

        def configure_model(self) -> None:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, idx: int) -> torch.Tensor:
            return lm_loss(self.net, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    cb = SDCGuardCallback(replay_every=1)
    strategy = SDCGuardModelParallelStrategy(cb)
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb, saver],
    )
    try:
        trainer.fit(Module(), torch.utils.data.DataLoader([make_batch(s, 0) for s in range(4)], batch_size=None))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():  # Lightning leaves its one-process group behind: later tests expect none
            dist.destroy_process_group()
    folders = sorted(tmp_path.glob("*.ckpt"))
    assert [f.name for f in folders] == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    assert cb.guard is not None
    # One process under FSDP2 reduces nothing, so no sample is judged and nothing is verified: the saves say so.
    vouched = cb.guard.last_verified_step is not None
    assert [(Path(i.checkpoint_id).name, i.step, i.saved, i.verified) for i in strategy.checkpointer.settled] == [
        ("epoch=0-step=2.ckpt", 1, True, vouched),
        ("epoch=0-step=4.ckpt", 3, True, vouched),
    ]
    assert all(scrub_one(f).status == "clean" and (f / "meta.pt").exists() for f in folders)
    assert [c[:3] for c in cb.guard.state_dict()["verification"]["checkpoints"]] == [
        [str(folders[0]), 1, vouched],
        [str(folders[1]), 3, vouched],
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_process_writer_saves_through_dcps_checkpoint_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP's checkpoint process needs an initialized group and a non-daemonic parent (the gloo harness's ranks are
    daemonic), so this runs one rank in the test process itself."""
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # DCP's daemon reaches the coordinator there
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model, opt, guard = _setup(tmp_path)
        _train(model, guard, opt, range(2))
        saver = checkpoint.AsyncCheckpointer(writer="process")
        saver.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=tmp_path / "p", guard=guard)
        info = saver.close()
        assert info is not None and info.saved and info.verified, info
        assert scrub_one(tmp_path / "p").status == "clean"
    finally:
        dist.destroy_process_group()
