from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.devices import cpu_id, device_kind, gpu_id, parse_device_id, parse_spec, sim_id
from sdcguard.errors import BadInput


def test_gpu_id_normalizes_prefix_and_case() -> None:
    u = "12345678-ABCD-ef01-2345-6789abcdef01"
    assert gpu_id(u) == gpu_id("GPU-" + u) == "GPU-12345678-abcd-ef01-2345-6789abcdef01"
    assert device_kind(gpu_id(u)) == "gpu"


@given(st.integers(min_value=0, max_value=10_000), st.from_regex(r"[a-z][a-z0-9\-]{0,20}", fullmatch=True))
def test_cpu_id_round_trips(core: int, host: str) -> None:
    assert parse_device_id(cpu_id(core, host)) == ("cpu", host, str(core))


def test_specs() -> None:
    assert parse_spec("all").kind == "all"
    assert parse_spec("cuda:3").index == 3
    assert parse_spec("cpu:0").kind == "cpu"
    assert parse_spec(sim_id(7)).device == "sim:7"
    for bad in ["gpu7", "cuda:", "cpu:-1", "", "GPU-xyz"]:
        with pytest.raises(BadInput):
            parse_spec(bad)
