"""FSDP2 keeps its parameter groups in torch's private state, in a place that moved between torch releases: torch
2.13 a list (``_fsdp_param_groups``), torch 2.11 one group or None (``_fsdp_param_group``). The hooks read both; on
the first GPU run (torch 2.11) they read neither, set no produced-gradient hook, and an FSDP2 step with a faulty
matmul committed. These build each layout by hand, since one torch holds only one of them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sdcguard.training.hooks import fsdp


def _module(state: Any) -> Any:
    return SimpleNamespace(_get_fsdp_state=lambda: state)


def _group(*pairs: tuple[str, Any]) -> Any:
    params = [SimpleNamespace(sharded_param=s, _unsharded_param=u) for s, u in pairs]
    return SimpleNamespace(fsdp_params=params, reduce_grads=True, all_reduce_grads=False)


@pytest.mark.parametrize("layout", ["list (torch 2.13)", "one group (torch 2.11)"])
def test_the_unsharded_parameters_and_the_sync_setting_are_read_in_either_layout(layout: str) -> None:
    group = _group(("a", "A"), ("b", None))
    state = (
        SimpleNamespace(_fsdp_param_groups=[group])
        if layout.startswith("list")
        else SimpleNamespace(_fsdp_param_group=group)
    )
    module = _module(state)
    assert fsdp._unsharded(module) == [("a", "A")]  # the one made so far
    assert fsdp._sync_setting(module) == [(True, False)]
    group.reduce_grads = False
    fsdp._restore_sync(module, [(True, True)])
    assert (group.reduce_grads, group.all_reduce_grads) == (True, True)


def test_a_module_without_parameters_and_an_unknown_layout() -> None:
    empty = _module(SimpleNamespace(_fsdp_param_group=None))  # torch 2.11: a fully_shard module with no parameters
    assert fsdp._unsharded(empty) == [] and fsdp._sync_setting(empty) == []
    unknown = _module(SimpleNamespace())
    assert fsdp._unsharded(unknown) == [] and fsdp._sync_setting(unknown) is None
