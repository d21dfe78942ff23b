"""The fault injector of ``benchmarks/peer_checksums/`` (no peer, no network): it numbers the model's matmuls only,
so the k-th matmul is the same op with a checker on or off, and it corrupts that op's result before the checker sees
it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from benchmarks.peer_checksums.worker import INJECTOR, load_by_path
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from sdcguard.training.checksums.mode import ChecksumMode


def _load(path: Path, name: str, source: str):
    path.write_text(source)
    return load_by_path(path, name)


@pytest.fixture()
def inj_mod():
    return load_by_path(INJECTOR, "sdc_fault_injector_test")  # by its path, as both workers load it


def _step(model, inj, mode=None):
    torch.manual_seed(1)
    batch = make_batch(0, 0)
    with inj.below():
        if mode is not None:
            mode.begin()
        try:
            with inj.above():
                lm_loss(model, batch).backward()
        finally:
            failures = mode.end() if mode is not None else []
    model.zero_grad(set_to_none=True)
    return failures


def _weights(model):
    return {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}


def test_same_numbering_with_the_checker_and_the_fault_reaches_it(inj_mod):
    torch.manual_seed(0)
    model = TinyTransformer()
    mode = ChecksumMode(model)
    plain = inj_mod.Injector(weights=_weights(model))
    _step(model, plain)
    under = inj_mod.Injector(weights=_weights(model))
    _step(model, under, mode)
    assert under.ops == plain.ops and under.foreign == 0
    passes = {(o["pass"], o["kind"]) for o in plain.ops}
    assert passes == {("forward", "linear"), ("forward", "bmm"), ("dX", "linear"), ("dX", "bmm"), ("dW", "linear")}
    for k in (0, next(i for i, o in enumerate(plain.ops) if o["pass"] == "dX" and o["kind"] == "bmm")):
        fault = {"kind": "bit", "bit": 30, "element": [0] * len(plain.ops[k]["out"])}
        alone = inj_mod.Injector(target=k, fault=fault, weights=_weights(model))
        _step(model, alone)
        checked = inj_mod.Injector(target=k, fault=fault, weights=_weights(model))
        failures = _step(model, checked, mode)
        assert checked.record == alone.record and checked.record["changed"] == 1
        assert failures and failures[0].phase == plain.ops[k]["pass"] and failures[0].sticky is False


def test_a_checkers_own_matmuls_at_the_models_level_are_not_numbered(inj_mod, tmp_path):
    checker = _load(
        tmp_path / "fake_checker.py",
        "fake_checker",
        (
            "import torch\n"
            "def hook(mod, args, out):\n"
            "    torch.mm(out.reshape(-1, out.shape[-1]), torch.ones(out.shape[-1], 1))\n"
        ),
    )
    torch.manual_seed(0)
    model = TinyTransformer()
    plain = inj_mod.Injector(weights=_weights(model))
    _step(model, plain)
    hooks = [m.register_forward_hook(checker.hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        skipped = inj_mod.Injector(weights=_weights(model), skip_files=[checker.__file__])
        _step(model, skipped)
        counted = inj_mod.Injector(weights=_weights(model))
        _step(model, counted)
    finally:
        for h in hooks:
            h.remove()
    assert skipped.ops == plain.ops and skipped.foreign == len(hooks)
    assert len(counted.ops) == len(plain.ops) + len(hooks)


@pytest.mark.parametrize("kind", ["zero", "nan", "tile-sign"])
def test_the_other_faults(inj_mod, kind):
    torch.manual_seed(0)
    model = TinyTransformer()
    census = inj_mod.Injector(weights=_weights(model))
    _step(model, census)
    for k, op in enumerate(census.ops[:4]):
        inj = inj_mod.Injector(target=k, fault={"kind": kind, "element": [1] * len(op["out"])}, weights=_weights(model))
        _step(model, inj)
        assert inj.record["changed"] >= 1 and inj.record["index"] == k and inj.record["op"] == op["op"]
        if kind == "nan":
            assert math.isnan(inj.record["new"])
