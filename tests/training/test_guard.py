"""The training guard in one process: capture and replay, gradients, accumulation, veto actions, store, calibration."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import OrderedDict, namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from sdcguard.contract import EXIT_SUSPECT_DEVICE
from sdcguard.errors import BadInput, CorruptionDetected
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from sdcguard.training.config import GuardConfig
from sdcguard.training.digest import LocalRecord
from sdcguard.training.guard import SDCGuard
from sdcguard.training.hooks.ddp import ParamTaps
from sdcguard.training.replay.capture import RngHook, capture_rng, make_capture, map_tensors, rng_replayed
from sdcguard.training.replay.recompute import replay
from tests._logs import expect_log

ROOT = Path(__file__).resolve().parents[2]


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def _model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer()


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


# --------------------------------------------------------------------------------------------- capture


@given(st.integers(0, 2**31 - 1), st.integers(0, 50))
def test_replayed_rng_restores_the_training_stream(seed: int, draws: int) -> None:
    """A replay in the middle of training leaves every generator exactly where it was."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    state = capture_rng()
    expected_first = _draws()
    for _ in range(draws):
        _draws()
    with rng_replayed(state):
        assert _draws() == expected_first  # the captured stream replays
    after = capture_rng()
    with rng_replayed(after):
        continued = _draws()
    assert _draws() == continued


def test_rng_hook_state_is_captured_and_restored() -> None:
    box = {"v": 1}
    hook = RngHook(get=lambda: box["v"], set=lambda v: box.update(v=v))
    state = capture_rng(hook)
    box["v"] = 99
    with rng_replayed(state, hook):
        assert box["v"] == 1
    assert box["v"] == 99


Pair = namedtuple("Pair", "a b")

nested = st.recursive(
    st.integers(1, 4).map(lambda n: torch.arange(n)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), inner, max_size=3),
        st.tuples(inner, inner).map(lambda t: Pair(*t)),
        st.dictionaries(st.text("xy", min_size=1, max_size=2), inner, max_size=2).map(OrderedDict),
    ),
    max_leaves=6,
)


@given(nested)
def test_capture_keeps_the_batch_structure_and_values(batch: object) -> None:
    cap = make_capture(step=0, rank=0, micro_batch=0, batch=batch, rng=capture_rng())
    seen: list[tuple[list[int], list[int]]] = []

    def same(a: object, b: object) -> None:
        assert type(a) is type(b)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()  # a copy, not a view
            seen.append((a.tolist(), b.tolist()))
        elif isinstance(a, dict):
            assert list(a) == list(b)
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                same(x, y)

    same(batch, cap.batch)
    assert map_tensors(cap.batch, lambda t: t) is not None


# ---------------------------------------------------------------------------------------------- replay


def _taps(model: nn.Module) -> ParamTaps:
    return ParamTaps(model, [(n, p) for n, p in model.named_parameters()])


def test_replay_is_bit_identical_to_the_original_and_touches_nothing() -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 1))
    params = list(model.parameters())
    opt = torch.optim.Adam(params)
    x = torch.randn(5, 6)

    def loss_fn(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        return m(b).square().mean()

    loss_fn(model, x).backward()
    opt.step()  # optimizer state exists
    taps = _taps(model)
    cap = make_capture(step=0, rank=0, micro_batch=0, batch=x, rng=capture_rng())
    buffers = [b.clone() for b in model.buffers()]
    record = LocalRecord(len(params), torch.device("cpu"))
    taps.arm(record)  # the original: the hooks see the gradients of the framework's own backward
    loss = loss_fn(model, x)
    record.set_loss(loss)
    loss.backward()
    taps.arm(None)
    original = record.digest()
    grads_before = [p.grad.clone() for p in params]
    opt_state = {k: {n: v.clone() for n, v in s.items()} for k, s in enumerate(opt.state.values())}
    moved = [b.clone() for b in model.buffers()]
    with torch.no_grad():  # replay from the buffers the original started from
        for b, v in zip(model.buffers(), buffers):
            b.copy_(v)
    rng_before = torch.random.get_rng_state()
    again = replay(taps, loss_fn, cap, device=torch.device("cpu"), same_process=True)
    assert again == original and all(original.units)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the training stream did not move
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads_before))  # .grad untouched
    for k, s in enumerate(opt.state.values()):
        assert all(torch.equal(v, opt_state[k][n]) for n, v in s.items())
    assert all(torch.equal(b, v) for b, v in zip(model.buffers(), buffers))  # buffers put back
    assert not all(torch.equal(b, v) for b, v in zip(moved, buffers))  # the forward does move them


def test_replay_at_other_parameter_values_differs_and_restores_live_values() -> None:
    model = _model()
    params = list(model.parameters())
    taps = _taps(model)
    cap = make_capture(step=0, rank=0, micro_batch=0, batch=make_batch(0, 0), rng=capture_rng())
    live = [p.detach().clone() for p in params]
    base = replay(taps, lm_loss, cap, device=torch.device("cpu"), same_process=True)
    shifted = [p.detach() + 1e-3 for p in params]
    other = replay(
        taps, lm_loss, cap, device=torch.device("cpu"), same_process=True, params=params, param_values=shifted
    )
    assert other != base and other.first_difference(base) is not None
    assert all(torch.equal(p, v) for p, v in zip(params, live))


# ----------------------------------------------------------------------------------------------- guard


def test_guard_gradients_match_plain_backward_bit_for_bit() -> None:
    ref, guarded = _model(), _model()
    batch = make_batch(1, 0)
    torch.manual_seed(5)
    lm_loss(ref, batch).backward()
    guard = SDCGuard(guarded, lm_loss, replay_every=1, weight_check_every=1)
    torch.manual_seed(5)
    report = guard.step(0, batch)
    assert report.commit and report.replayed and not report.incidents
    assert report.checks == ("nonfinite", "replay", "checksum")  # no memory check before the first optimizer step
    for p, q in zip(ref.parameters(), guarded.parameters()):
        assert torch.equal(p.grad, q.grad)
    # the replay restored the random stream: the next draw is the one an unguarded run would make
    torch.manual_seed(5)
    lm_loss(_model(), batch)
    expected_next = torch.rand(())
    torch.manual_seed(5)
    SDCGuard(_model(), lm_loss, replay_every=1).step(0, batch)
    assert torch.equal(torch.rand(()), expected_next)


@pytest.mark.parametrize("k", [3, 4])
def test_gradient_accumulation_matches_an_accumulating_loop(k: int) -> None:
    ref, guarded = _model(), _model()
    mbs = [make_batch(2, i) for i in range(k)]
    torch.manual_seed(3)
    for mb in mbs:
        (lm_loss(ref, mb) / k).backward()
    guard = SDCGuard(guarded, lm_loss, replay_every=1)
    torch.manual_seed(3)
    for step in range(k):  # the sample rotates over the micro-batches; every one replays bit for bit
        report = guard.step(step, micro_batches=mbs)
        assert report.commit and not report.incidents
        if step == 0:
            for p, q in zip(ref.parameters(), guarded.parameters()):
                assert torch.equal(p.grad, q.grad)
        guarded.zero_grad()


def test_bf16_autocast_is_replayed_under_the_same_precision() -> None:
    def loss_fn(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lm_loss(m, b)

    guard = SDCGuard(_model(), loss_fn, replay_every=1)
    assert all(guard.step(s, make_batch(s, 0)).commit for s in range(2)) and not guard.incidents
    # the guard reads the autocast state inside the forward: a caller's autocast context is replayed too
    outer = SDCGuard(_model(), lm_loss, replay_every=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = outer.step(0, make_batch(0, 0))
    assert report.commit and not report.incidents
    fault = OpFaultMode(
        Fault(pattern="bitflip", bit="exponent", timing="transient", seed=4), ops="matmul", phase="forward"
    )
    with fault:
        report = guard.step(5, make_batch(5, 0))
    assert fault.records and [i.kind for i in report.incidents] == ["replay"] and not report.commit


@pytest.mark.parametrize("on_detect", ["skip", "record", "raise"])
def test_a_flipped_bit_is_caught_by_a_same_device_replay(on_detect: str) -> None:
    model = _model()
    guard = SDCGuard(model, lm_loss, replay_every=1, on_detect=on_detect)
    fault = OpFaultMode(
        Fault(pattern="bitflip", bit="high_mantissa", timing="transient", seed=1), ops="gelu", phase="forward"
    )
    with fault:
        if on_detect == "raise":
            with pytest.raises(CorruptionDetected) as e:
                guard.step(7, make_batch(7, 0))
            assert e.value.incidents and e.value.incidents[0].step == 7
            return
        report = guard.step(7, make_batch(7, 0))
    assert fault.records, "the injector changed nothing"
    assert [i.kind for i in report.incidents] == ["replay"]
    assert report.incidents[0].suspect_ranks == (0,) and report.incidents[0].step == 7
    assert report.commit is (on_detect == "record")
    assert (model.head.weight.grad is None) is (on_detect == "skip")
    assert guard.incidents == list(report.incidents)


def test_exit_mode_exits_86_and_writes_the_suspect_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "suspect.jsonl"
    monkeypatch.setenv("SDCGUARD_SUSPECT_FILE", str(marker))
    guard = SDCGuard(_model(), lm_loss, replay_every=1, on_detect="exit", checksum_every=0)  # replay's incident
    fault = Fault(pattern="bitflip", bit="sign", timing="transient")
    with OpFaultMode(fault, ops="matmul", phase="forward"), pytest.raises(SystemExit) as e:
        guard.step(3, make_batch(3, 0))
    assert e.value.code == EXIT_SUSPECT_DEVICE
    line = json.loads(marker.read_text().splitlines()[0])
    assert line["kind"] == "replay" and line["step"] == 3 and line["suspect_ranks"] == [0]


def test_incidents_reach_the_store_and_a_broken_store_only_warns(tmp_path: Path) -> None:
    from sdcguard import Store

    fault = Fault(pattern="bitflip", bit="exponent", timing="transient", seed=2)
    db = tmp_path / "fleet.db"
    guard = SDCGuard(_model(), lm_loss, replay_every=1, store=db, on_detect="skip")
    with OpFaultMode(fault, ops="embedding", phase="forward"):
        report = guard.step(4, make_batch(4, 0))
    assert report.incidents
    with Store.open(tmp_path / "fleet.drills.db", create=False) as store:  # an injector's job: a drill
        stored = store.training.incidents()
    assert len(stored) == 1 and stored[0].step == 4 and stored[0].kind == "replay"

    bad = tmp_path / "missing-dir" / "sub" / "fleet.db"
    (tmp_path / "missing-dir").write_text("a file where a directory should be")
    broken = SDCGuard(_model(), lm_loss, replay_every=1, store=bad)
    with OpFaultMode(fault, ops="embedding", phase="forward"), expect_log("could not record"):
        report = broken.step(4, make_batch(4, 0))
    assert report.incidents and broken.incidents == list(report.incidents) and not report.commit


def _noisy_loss() -> object:
    noise = np.random.default_rng()  # a generator the guard cannot capture: a stand-in for atomics

    def noisy_loss(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = lm_loss(m, batch)
        acc = torch.zeros(3).index_add_(0, torch.tensor([0, 0]), torch.tensor([1.0, float(noise.random())]))
        return loss + 1e-3 * acc[0]

    return noisy_loss


def test_calibrate_names_nondeterminism_and_turns_replay_off() -> None:
    guard = SDCGuard(_model(), _noisy_loss(), replay_every=1)
    report = guard.calibrate(make_batch(0, 0))
    assert not report.deterministic and not report.same_device
    assert any("index_add" in c for c in report.causes)
    assert any("deterministic algorithms" in c for c in report.causes)
    assert guard.nondeterministic
    step = guard.step(0, make_batch(0, 0))
    assert step.commit and not step.incidents and step.checks == ("nonfinite", "checksum") and not step.replayed

    clean = SDCGuard(_model(), lm_loss)
    ok = clean.calibrate(make_batch(0, 0))
    assert ok.deterministic and not ok.causes and not clean.nondeterministic
    assert all(p.grad is None for p in clean.params)


def test_a_single_process_calibration_never_calls_one_differing_computation_software() -> None:
    """A one-off fault in one of the calibration's two computations was ``software`` (replay off for the run),
    against ``SDCGuard.calibrate``'s docstring: a third computation now outvotes it."""
    guard = SDCGuard(_model(), lm_loss, replay_every=1, escalate="off")
    fault = OpFaultMode(Fault(pattern="bitflip", bit="exponent", timing="transient", seed=1), ops="gelu")
    with fault:
        report = guard.calibrate(make_batch(0, 0))
    assert len(fault.records) == 1
    assert report.verdict == "hardware" and report.deterministic and report.ranks_differing == (0,)
    assert not guard.nondeterministic
    (incident,) = guard.incidents
    assert incident.kind == "calibration" and incident.suspect_ranks == (0,) and incident.sticky is False
    r = guard.step(0, make_batch(0, 0))
    assert r.commit and r.replayed  # replay stays on


def test_without_calibrate_a_nondeterministic_model_is_recognised_not_blamed() -> None:
    guard = SDCGuard(_model(), _noisy_loss(), replay_every=1)
    with expect_log("not bit-identical.*index_add"):
        first = guard.step(0, make_batch(0, 0))
    assert first.commit and [i.kind for i in first.incidents] == ["nondeterministic"]
    assert first.incidents[0].suspect_ranks == () and first.incidents[0].device is None
    later = [guard.step(s, make_batch(s, 0)) for s in range(1, 4)]
    assert all(r.commit and not r.incidents and not r.replayed for r in later)  # replay is off, training goes on
    assert guard.state_dict()["determinism"]["state"] == "nondeterministic"


def test_state_dict_round_trip() -> None:
    guard = SDCGuard(_model(), lm_loss, replay_every=2)
    for s in range(5):
        guard.step(s, make_batch(s, 0))
    state = guard.state_dict()
    fresh = SDCGuard(_model(), lm_loss, replay_every=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == {**state, "incidents": 0}
    assert state["samples"] == 3 and state["steps"] == 5 and state["last_step"] == 4
    assert state["determinism"]["state"] == "deterministic"
    with pytest.raises(BadInput):
        fresh.load_state_dict({"version": 99})


def test_a_version_1_state_is_still_read() -> None:
    old = {"version": 1, "steps": 7, "samples": 4, "last_step": 6, "nondeterministic": True}
    guard = SDCGuard(_model(), lm_loss, replay_every=2)
    guard.load_state_dict(old)
    state = guard.state_dict()
    assert (state["steps"], state["samples"], state["last_step"]) == (7, 4, 6)
    assert state["determinism"]["state"] == "nondeterministic" and guard.nondeterministic


def test_a_loss_fn_that_returns_no_scalar_is_named() -> None:
    guard = SDCGuard(_model(), lambda m, b: m(b["tokens"]))  # logits, not a loss
    with pytest.raises(ValueError, match="scalar tensor"):
        guard.step(0, make_batch(0, 0))
    assert not guard.observing  # the step was abandoned cleanly: the next one starts


@pytest.mark.parametrize(
    "kwargs",
    [
        {"replay_every": -1},
        {"weight_check_every": 1.5},
        {"on_detect": "ignore"},
        {"shadows": "spare"},
        {"shadows": []},
        {"shadows": [1, 1]},
    ],
)
def test_bad_settings_are_rejected_with_a_clear_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(BadInput):
        GuardConfig(**kwargs)


def test_step_argument_errors() -> None:
    guard = SDCGuard(_model(), lm_loss)
    with pytest.raises(BadInput):
        guard.step(0)
    with pytest.raises(BadInput):
        guard.step(0, make_batch(0, 0), micro_batches=[make_batch(0, 0)])
    with pytest.raises(BadInput, match="dedicated shadows need"):
        SDCGuard(_model(), lm_loss, shadows=[1])


def test_importing_sdcguard_stays_light_and_exposes_the_guard() -> None:
    import sdcguard

    assert sdcguard.SDCGuard is SDCGuard and {"SDCGuard", "StepReport", "CalibrationReport"} <= set(sdcguard.__all__)
    code = "import sys, sdcguard; assert 'torch' not in sys.modules, 'importing sdcguard imported torch'"
    subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": _pythonpath()}, check=True, timeout=120
    )
