"""Checkpoints at rest: ``sdcguard scrub`` and ``load(..., fallback=True)``.

A flipped bit in any byte of any saved tensor is found by the scrub and by ``load``, both naming the tensor
(a property over keys and byte positions); a damaged DCP index or fingerprint record is named as such; a
truncated data file is corrupt, a checkpoint without a record cannot be checked; the CLI's exit codes are 0 / 1 /
2 and its verdicts land in the store; the fallback loads the newest checkpoint that is verified and still verifies,
from a directory or from the fleet store's record.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcguard import CheckpointCorrupted, CheckpointError, SDCGuard, Store, checkpoint
from sdcguard.checkpoint.scrub import latest_good, scrub, scrub_one
from sdcguard.cli import cli
from sdcguard.testing.models import TinyTransformer
from tests._checkpoints import flip_byte_of, trained
from tests._logs import expect_log

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _trained(steps: int = 2, store: Path | None = None) -> tuple[TinyTransformer, torch.optim.Optimizer, SDCGuard]:
    return trained(steps, store)


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """One checkpoint of model and AdamW state; every tensor key with its size in bytes."""
    root = tmp_path_factory.mktemp("saved")
    model, opt, guard = _trained()
    checkpoint.save(_state(model, opt), checkpoint_id=root / "c", guard=guard)
    from torch.distributed.checkpoint import FileSystemReader

    from sdcguard.checkpoint.record import fingerprints

    meta = FileSystemReader(str(root / "c")).read_metadata().state_dict_metadata
    sizes = {
        k: math.prod(meta[k].size) * torch.empty((), dtype=meta[k].properties.dtype).element_size()
        for k in fingerprints(_state(model, opt))
    }
    sizes = {k: n for k, n in sizes.items() if n}
    return root / "c", sizes


def test_a_clean_checkpoint_scrubs_clean(saved: tuple[Path, dict[str, int]]) -> None:
    path, sizes = saved
    result = scrub_one(path)
    assert result.status == "clean" and result.tensors == len(sizes) and not result.bad
    assert result.bytes >= sum(sizes.values())


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_flipped_bit_in_any_tensor_is_named_by_scrub_and_load(
    saved: tuple[Path, dict[str, int]], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path, sizes = saved
    key = data.draw(st.sampled_from(sorted(sizes)), label="key")
    at = data.draw(st.integers(0, sizes[key] - 1), label="byte")
    copy = tmp_path_factory.mktemp("rot") / "c"
    shutil.copytree(path, copy)
    flip_byte_of(copy, key, at=at)
    result = scrub_one(copy)
    assert result.status == "corrupt" and result.bad == (key,) and key in result.detail
    model, opt, _ = _trained(1)
    with pytest.raises(CheckpointCorrupted) as e:
        checkpoint.load(_state(model, opt), checkpoint_id=copy)
    assert e.value.keys == (key,)


def test_damaged_index_record_and_data_files_are_named_as_such(
    saved: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    path, _ = saved
    model, opt, _ = _trained(1)

    meta = tmp_path / "meta"
    shutil.copytree(path, meta)
    blob = bytearray((meta / ".metadata").read_bytes())
    blob[len(blob) // 2] ^= 0x01
    (meta / ".metadata").write_bytes(bytes(blob))
    result = scrub_one(meta)
    assert result.status == "corrupt" and result.bad == (".metadata",) and "metadata file" in result.detail
    with pytest.raises(CheckpointCorrupted, match=r"DCP metadata file \.metadata is damaged"):
        checkpoint.load(_state(model, opt), checkpoint_id=meta)

    record = tmp_path / "record"
    shutil.copytree(path, record)
    body = json.loads((record / checkpoint.SIDECAR).read_text())
    key = sorted(body["fingerprints"])[0]
    value = next(iter(body["fingerprints"][key]))
    body["fingerprints"][key] = {f"{int(value, 16) ^ 1:016x}": [0]}  # still valid JSON: a rotted digit
    (record / checkpoint.SIDECAR).write_text(json.dumps(body, sort_keys=True))
    result = scrub_one(record)
    assert result.status == "corrupt" and result.bad == (checkpoint.SIDECAR,) and "record is damaged" in result.detail
    with pytest.raises(CheckpointError, match="is damaged"):
        checkpoint.load(_state(model, opt), checkpoint_id=record)
    (record / checkpoint.SIDECAR).write_text(json.dumps(body)[:50])  # truncated
    assert scrub_one(record).bad == (checkpoint.SIDECAR,)

    short = tmp_path / "short"
    shutil.copytree(path, short)
    data = next(short.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:-1000])
    result = scrub_one(short)
    assert result.status == "corrupt" and result.bad and "truncated" in result.detail

    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    (bare / checkpoint.SIDECAR).unlink()
    assert scrub_one(bare).status == "unreadable" and "no fingerprint record" in scrub_one(bare).detail
    assert scrub_one(tmp_path / "nothing").status == "unreadable"


def _rerecorded(path: Path, body: dict[str, object]) -> None:
    """Write ``body`` as the checkpoint's record, its self-check and the metadata's fingerprint made anew (what a
    save that recorded it so would have written)."""
    from sdcguard.checkpoint.record import file_fingerprint, write_record

    body = {k: v for k, v in body.items() if k != "check"}
    body["metadata"] = file_fingerprint(path / ".metadata")
    write_record(path / checkpoint.SIDECAR, body)


def test_tensors_without_a_fingerprint_or_saved_with_transforms_are_unverified_not_clean(
    saved: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """A key without a recorded fingerprint, and an item saved with transforms (its stored bytes are not the
    tensor's), ended as ``clean``: a verdict no comparison backed."""
    import pickle

    path, sizes = saved
    unrecorded = tmp_path / "unrecorded"
    shutil.copytree(path, unrecorded)
    body = json.loads((unrecorded / checkpoint.SIDECAR).read_text())
    key = sorted(sizes)[0]
    del body["fingerprints"][key]
    _rerecorded(unrecorded, body)
    result = scrub_one(unrecorded)
    assert result.status == "unverified" and result.unverified == (key,) and not result.bad
    assert result.tensors == len(sizes) - 1 and key in result.detail

    transformed = tmp_path / "transformed"
    shutil.copytree(path, transformed)
    meta = pickle.loads((transformed / ".metadata").read_bytes())
    index = next(i for i in meta.storage_data if i.fqn == sorted(sizes)[1])
    info = meta.storage_data[index]
    meta.storage_data[index] = type(info)(
        relative_path=info.relative_path, offset=info.offset, length=info.length, transform_descriptors=["zstd"]
    )
    (transformed / ".metadata").write_bytes(pickle.dumps(meta))
    _rerecorded(transformed, json.loads((transformed / checkpoint.SIDECAR).read_text()))
    result = scrub_one(transformed)
    assert result.status == "unverified" and result.unverified == (sorted(sizes)[1],)
    assert result.tensors == len(sizes) - 1

    # a corrupted tensor beside an unverified one: corrupt, and both named
    flip_byte_of(unrecorded, sorted(sizes)[2])
    result = scrub_one(unrecorded)
    assert result.status == "corrupt" and result.bad == (sorted(sizes)[2],) and result.unverified == (key,)

    # the CLI: exit 2 (could not check all of it), the store keeps the status and the names
    db = tmp_path / "fleet.db"
    done = CliRunner().invoke(cli, ["--db", str(db), "scrub", str(transformed)])
    assert done.exit_code == 2 and done.output.startswith("unverified") and "1 unverified" in done.output
    with Store.open(db) as store:
        [row] = store.training.scrubs()
    assert (row.status, row.unverified, row.tensors) == ("unverified", (sorted(sizes)[1],), len(sizes) - 1)
    found, tried = latest_good(tmp_path)  # never falls back to an unverified checkpoint
    assert found is None and sorted(t.status for t in tried) == ["corrupt", "unverified"]


def test_the_cli_exit_codes_name_the_tensor_and_record_verdicts(
    saved: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    path, _ = saved
    root = tmp_path / "run"
    shutil.copytree(path, root / "a")
    shutil.copytree(path, root / "b")
    db = tmp_path / "fleet.db"
    ok = CliRunner().invoke(cli, ["--db", str(db), "scrub", str(root)])
    assert ok.exit_code == 0, ok.output
    assert [line.split()[0] for line in ok.output.splitlines()] == ["clean", "clean"]

    flip_byte_of(root / "b", "model.head.weight")
    bad = CliRunner().invoke(cli, ["--db", str(db), "scrub", str(root / "a"), str(root / "b")])
    assert bad.exit_code == 1 and "model.head.weight" in bad.output
    # a finding is on stderr, as every error; a clean checkpoint's line on stdout
    assert bad.stderr.startswith("corrupt") and "model.head.weight" in bad.stderr and bad.stderr.count("\n") == 1
    assert bad.stdout.startswith("clean") and "model.head.weight" not in bad.stdout

    missing = CliRunner().invoke(cli, ["--db", str(db), "scrub", str(root / "a"), str(tmp_path / "gone")])
    assert missing.exit_code == 2 and "no checkpoint at" in missing.output

    shown = CliRunner().invoke(cli, ["--db", str(db), "scrub", "--no-record", "--format", "json", str(root / "b")])
    assert shown.exit_code == 1 and json.loads(shown.output)[0]["bad"] == ["model.head.weight"]

    with Store.open(db) as store:
        rows = [(Path(s.checkpoint_id).name, s.status, s.bad) for s in store.training.scrubs()]
    assert rows == [
        ("a", "clean", ()),
        ("b", "clean", ()),
        ("a", "clean", ()),
        ("b", "corrupt", ("model.head.weight",)),
        ("a", "clean", ()),
        ("gone", "unreadable", ()),
    ]
    none = CliRunner().invoke(cli, ["scrub"])
    assert none.exit_code == 2


def test_fallback_loads_the_newest_checkpoint_that_is_verified_and_still_verifies(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    model, opt, guard = _trained(3, store=db)
    root = tmp_path / "ckpt"
    for step in (0, 1, 2):
        checkpoint.save(_state(model, opt), checkpoint_id=root / f"step{step}", guard=guard, step=step)
    checkpoint.save(_state(model, opt), checkpoint_id=root / "step9", guard=guard, step=9)  # not verified
    flip_byte_of(root / "step2", "model.tok.weight")

    target_model, target_opt, _ = _trained(1)
    with expect_log("passing over 2 newer"):
        info = checkpoint.load(_state(target_model, target_opt), checkpoint_id=root, fallback=True)
    assert Path(info.checkpoint_id) == root / "step1" and info.verified
    assert [Path(s.split(":")[0]).name for s in info.skipped] == ["step9", "step2"]
    assert "not verified" in info.skipped[0] and "model.tok.weight" in info.skipped[1]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), target_model.state_dict().values()))

    # naming one checkpoint: it, then its older siblings
    with expect_log("passing over"):
        info = checkpoint.load(_state(target_model, target_opt), checkpoint_id=root / "step2", fallback=True)
    assert Path(info.checkpoint_id) == root / "step1"

    found, tried = latest_good(root)
    assert found == root / "step1" and [t.status for t in tried] == ["corrupt", "clean"]

    # from the fleet store's record (as after a merge on another node)
    with Store.open(db) as store:
        assert [(Path(c.checkpoint_id).name, c.verified) for c in store.training.checkpoints()] == [
            ("step0", True),
            ("step1", True),
            ("step2", True),
            ("step9", False),
        ]
    with expect_log("passing over"):
        info = checkpoint.load(_state(target_model, target_opt), checkpoint_id=root, store=db)
    assert Path(info.checkpoint_id) == root / "step1"
    assert latest_good(root, store=db)[0] == root / "step1"

    flip_byte_of(root / "step1", "model.pos")
    flip_byte_of(root / "step0", "model.pos")
    with pytest.raises(CheckpointError, match="no verified checkpoint that still verifies"):
        checkpoint.load(_state(target_model, target_opt), checkpoint_id=root, fallback=True)
    found, tried = latest_good(root)
    assert found is None and [Path(t.checkpoint_id).name for t in tried] == ["step2", "step1", "step0"]
    assert [r.status for r in scrub([root])] == ["corrupt", "corrupt", "corrupt", "clean"]


def test_odd_layouts_scrub_clean_and_a_flip_in_one_is_found(tmp_path: Path) -> None:
    """Tensors whose stored bytes are not in logical order (transposed, channels-last), float8, bf16, 0-d and empty
    ones take the slow path or the streamed one, and each is checked."""
    torch.manual_seed(0)
    state = {
        "t": torch.randn(64, 96).t().contiguous().t(),
        "cl": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "f8": torch.randn(64).to(torch.float8_e4m3fn),
        "bf": torch.randn(33).bfloat16(),
        "zero_d": torch.tensor(2.5),
        "empty": torch.empty(0),
        "big": torch.randn(3_000_000),
    }
    assert not state["t"].is_contiguous()
    checkpoint.save(state, checkpoint_id=tmp_path / "c")
    result = scrub_one(tmp_path / "c")
    assert result.status == "clean" and result.tensors >= 6, result
    for key in ("t", "cl", "f8", "big"):
        copy = tmp_path / f"rot-{key}"
        shutil.copytree(tmp_path / "c", copy)
        flip_byte_of(copy, key, at=11)
        result = scrub_one(copy)
        assert result.status == "corrupt" and result.bad == (key,), result


@settings(max_examples=60)
@given(data=st.binary(max_size=300_000), cuts=st.lists(st.integers(0, 300_000), max_size=6))
def test_a_streamed_fingerprint_equals_the_fingerprint_of_the_whole(data: bytes, cuts: list[int]) -> None:
    import numpy as np

    from sdcguard.fingerprints import StreamingFingerprint, fingerprint

    stream = StreamingFingerprint()
    previous = 0
    for cut in sorted(c for c in cuts if c <= len(data)) + [len(data)]:
        stream.update(data[previous:cut])
        previous = cut
    assert stream.nbytes == len(data)
    assert stream.value == fingerprint(np.frombuffer(data, dtype=np.uint8))
