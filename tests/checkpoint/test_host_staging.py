"""The host stager of asynchronous saves: a host-memory state is copied and fingerprinted in one pass, into buffers
kept across saves; the copy is the state, bit for bit, with the nesting DCP flattens; the fingerprints are the ones
the checkpoint record keeps (the same keys, the same values); anything not in host memory is left to DCP's stager.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch

from sdcguard.checkpoint.record import fingerprints
from sdcguard.checkpoint.staging import HostStager


def _state() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": [torch.arange(6).view(2, 3).t(), 4, ("tag", torch.tensor(2.5))],
    }


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()


def test_the_staged_copy_is_the_state_and_its_fingerprints_are_the_records() -> None:
    state = _state()
    staged, fps = HostStager().stage(state)
    assert fps == fingerprints(state) == fingerprints(staged)  # the record's keys and values, before and after
    assert isinstance(staged["model"], OrderedDict) and list(staged["model"]) == list(state["model"])
    assert staged["optim"]["param_groups"] == state["optim"]["param_groups"]
    assert staged["optim"]["param_groups"] is not state["optim"]["param_groups"]  # deep-copied: later edits stay out
    assert staged["extra"][1] == 4 and staged["extra"][2][0] == "tag" and isinstance(staged["extra"][2], tuple)
    pairs = [
        (state["model"]["0.weight"], staged["model"]["0.weight"]),
        (state["extra"][0], staged["extra"][0]),
        (state["optim"]["state"][0]["exp_avg"], staged["optim"]["state"][0]["exp_avg"]),
    ]
    for src, dst in pairs:
        assert dst.is_contiguous() and dst.shape == src.shape and dst.dtype == src.dtype
        assert _bits(dst) == _bits(src) and dst.data_ptr() != src.data_ptr()


def test_buffers_are_reused_across_saves_unless_caching_is_off_and_follow_shape_changes() -> None:
    state = _state()
    cached, fresh = HostStager(), HostStager(cache=False)
    first, _ = cached.stage(state)
    ptr = first["model"]["0.weight"].data_ptr()
    with torch.no_grad():
        state["model"]["0.weight"].add_(1.0)  # the next save sees the new values in the same buffer
    second, fps = cached.stage(state)
    assert second["model"]["0.weight"].data_ptr() == ptr and fps == fingerprints(state)
    assert _bits(second["model"]["0.weight"]) == _bits(state["model"]["0.weight"])
    state["model"]["0.weight"] = torch.zeros(4, 4)  # another shape under the same key: a new buffer
    third, _ = cached.stage(state)
    assert third["model"]["0.weight"].shape == (4, 4) and third["model"]["0.weight"].data_ptr() != ptr
    a, _ = fresh.stage(state)
    b, _ = fresh.stage(state)
    assert a["model"]["0.bias"].data_ptr() != b["model"]["0.bias"].data_ptr()
    shared, _ = HostStager(shared=True).stage(state)
    assert shared["model"]["0.bias"].is_shared()  # what DCP's checkpoint process reads


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_it_takes_only_plain_dense_host_tensors() -> None:
    assert HostStager.takes(_state())
    assert HostStager.takes({"a": 1, "b": [torch.nn.Parameter(torch.randn(2))]})
    assert not HostStager.takes({"a": [torch.randn(2).to("meta")]})
    assert not HostStager.takes({"a": torch.randn(3).to_sparse()})
    assert not HostStager.takes({"a": torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)})

    class Sub(torch.Tensor):
        pass

    assert not HostStager.takes({"a": torch.randn(3).as_subclass(Sub)})
    if torch.cuda.is_available():
        assert not HostStager.takes({"a": torch.randn(3, device="cuda")})


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sharded_tensors_go_to_dcps_stager() -> None:
    """A ``DTensor`` (FSDP2's parameters) is not a plain tensor: DCP's stager copies it after a device fingerprint."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", store=dist.FileStore(f"{d}/store", 1), rank=0, world_size=1)
        try:
            mesh = init_device_mesh("cpu", (1,))
            x = DTensor.from_local(torch.randn(4), mesh, [Replicate()])
            assert not HostStager.takes({"w": x})
        finally:
            dist.destroy_process_group()
