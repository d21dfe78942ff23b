"""Checksum checks of the matmuls through the guard: every matmul the model runs is seen (nn.Linear, GPT-2's Conv1D
addmm, nn.MultiheadAttention's F.linear, attention bmm) forward and backward; a one-off fault is caught on its step,
vetoed and named transient; a sticky one escalates; the checks stay on with replay off; no clean step alarms (fp32,
bf16 autocast, the Lightning and Hugging Face callbacks); and in DDP and FSDP2 every rank vetoes alike, naming the
rank that computed."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from sdcguard import CorruptionDetected, SDCGuard
from sdcguard.inject.faults import Fault, FaultModel
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing import run_ranks
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from tests._logs import expect_log, logged

pytestmark = pytest.mark.timeout(240)
torch.set_num_threads(1)  # tiny models: threads only contend on a shared machine


def _model() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(d=16, heads=2, layers=1, seq=8, p=0.0)


def _fault(timing: str, phase: str, occurrence: int | None, bits: str = "exponent", rank: int | None = None) -> Any:
    fault = (
        Fault(pattern="nan", timing=timing, seed=3)
        if bits == "nan"
        else Fault(pattern="bitflip", bit=bits, timing=timing, seed=3)
    )
    return OpFaultMode(FaultModel(fault), ops="matmul", phase=phase, occurrence=occurrence, rank=rank)


def test_every_matmul_of_a_step_is_checked_and_a_clean_step_commits() -> None:
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    for step in range(3):
        r = guard.step(step, make_batch(step, 0))
        # 5 linear layers (forward + dX + dW each, but no dX into the first one's input... all counted) and 2 bmm
        assert r.commit and not r.incidents and r.checks == ("nonfinite", "checksum")
        assert r.matmuls_checked == r.matmuls_run > 0


@pytest.mark.parametrize(
    ("phase", "occurrence", "expect"), [("forward", 2, "forward"), ("backward", 0, None), ("backward", 5, None)]
)
def test_a_one_off_matmul_fault_is_caught_on_its_step_vetoed_and_named_transient(
    phase: str, occurrence: int, expect: str | None
) -> None:
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    mode = _fault("transient", phase, occurrence)
    with mode:
        mode.step = 0
        r = guard.step(0, make_batch(0, 0))
    assert len(mode.records) == 1
    assert not r.commit and all(p.grad is None for p in guard.params)
    (inc,) = r.incidents
    assert inc.kind == "checksum" and inc.suspect_ranks == (0,) and inc.sticky is False
    assert inc.parameter is not None and "transient" in inc.detail
    if expect:
        assert "forward" in inc.parameter
    else:
        assert "dX" in inc.parameter or "dW" in inc.parameter
    assert guard.step(1, make_batch(1, 0)).commit  # the next step is clean


def test_both_backward_passes_are_checked() -> None:
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    passes = set()
    for occurrence in range(12):
        mode = _fault("transient", "backward", occurrence)
        with mode:
            mode.step = occurrence
            r = guard.step(occurrence, make_batch(occurrence, 0))
        passes |= {i.parameter.split(", ")[-1].rstrip("]") for i in r.incidents if i.parameter}
    assert {"dX", "dW"} <= passes


def test_a_sticky_matmul_fault_escalates_and_names_the_device() -> None:
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    with _fault("sticky", "both", None) as mode, pytest.raises(CorruptionDetected) as e:
        mode.step = 0
        guard.step(0, make_batch(0, 0))
    (inc,) = e.value.incidents
    assert inc.kind == "checksum" and inc.sticky is True and inc.device and inc.hosts


@pytest.mark.parametrize("bad", [{"checksum_every": -1}, {"checksum_rows": 0}, {"checksum_every": 1.5}])
def test_bad_checksum_settings_are_refused(bad: dict[str, Any]) -> None:
    from sdcguard.errors import BadInput

    with pytest.raises(BadInput, match=next(iter(bad))):
        SDCGuard(_model(), lm_loss, **bad)


def test_unchecked_steps_run_without_the_mode() -> None:
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=3)
    checked = [bool(guard.step(s, make_batch(s, 0)).matmuls_checked) for s in range(6)]
    assert checked == [True, False, False, True, False, False]


def test_gpt2_conv1d_and_multihead_attention_matmuls_are_seen() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=61, n_positions=16, n_embd=16, n_layer=2, n_head=2, attn_implementation="eager"
    )
    gpt2 = transformers.GPT2LMHeadModel(config)
    guard = SDCGuard(
        gpt2, lambda m, b: m(input_ids=b["tokens"], labels=b["tokens"]).loss, replay_every=0, checksum_every=1
    )
    r = guard.step(0, make_batch(0, 0))
    assert r.commit and r.matmuls_checked == r.matmuls_run >= 2 * 4 * 3  # 4 Conv1D per layer, fwd + dX + dW
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    g2 = SDCGuard(mha, lambda m, b: m(b, b, b)[0].square().mean(), replay_every=0, checksum_every=1)
    r2 = g2.step(0, torch.randn(2, 5, 16))
    assert r2.commit and r2.matmuls_checked == r2.matmuls_run >= 6


def test_bf16_autocast_clean_steps_never_alarm_and_faults_are_caught() -> None:
    model = _model()

    def loss_fn(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lm_loss(m, b)

    guard = SDCGuard(model, loss_fn, replay_every=0, checksum_every=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(12):
        r = guard.step(step, make_batch(step, 0))
        assert r.commit and not r.incidents and r.matmuls_checked > 0
        opt.step()
        opt.zero_grad()
    with _fault("transient", "forward", 1, bits="nan") as mode:
        mode.step = 99
        r = guard.step(99, make_batch(99, 0))
    # the NaN reaches the loss: reported as such too (a non-finite step never commits, whatever caught it)
    assert not r.commit and [i.kind for i in r.incidents] == ["checksum", "nonfinite"]


# -------------------------------------------------------------------------------------------- frameworks


def _lightning_job(precision: str) -> list[tuple[int, bool, int, list[str]]]:
    import lightning.pytorch as L

    from sdcguard.adapters.lightning import SDCGuardCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return lm_loss(self.net, batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    seen: list[tuple[int, bool, int, list[str]]] = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            r = cb.last_report
            assert r is not None
            seen.append((r.step, r.commit, r.matmuls_checked, [i.kind for i in r.incidents]))

    cb = SDCGuardCallback(replay_every=0, checksum_every=1)
    mode = _fault("transient", "backward", 3)
    warnings.filterwarnings("ignore")
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        precision=precision,
        callbacks=[cb, Probe()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )

    class Faulty(L.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            mode.step = trainer.global_step

    trainer.callbacks.append(Faulty())
    mode.steps = {4}
    with mode:
        trainer.fit(Module(), torch.utils.data.DataLoader([make_batch(s, 0) for s in range(6)], batch_size=None))
    return seen


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_callback_checks_the_matmuls_and_vetoes_a_faulty_step(precision: str) -> None:
    pytest.importorskip("lightning.pytorch")
    seen = _lightning_job(precision)
    assert [s[0] for s in seen] == list(range(6)) and all(s[2] > 0 for s in seen)
    for step, commit, _, kinds in seen:
        assert (commit, kinds) == ((False, ["checksum"]) if step == 4 else (True, []))


def test_hf_trainer_callback_checks_gpt2_matmuls(tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from sdcguard.adapters.hf import SDCGuardTrainerCallback

    warnings.filterwarnings("ignore")
    config = transformers.GPT2Config(vocab_size=61, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    rows = [{"input_ids": make_batch(s, 0)["tokens"][0], "labels": make_batch(s, 0)["tokens"][0]} for s in range(8)]
    cb = SDCGuardTrainerCallback(replay_every=0, checksum_every=1)
    reports: list[Any] = []

    class Probe(transformers.TrainerCallback):
        def on_optimizer_step(self, *a: Any, **k: Any) -> None:
            reports.append(cb.last_report)

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb, Probe()]).train()
    assert len(reports) == 4 and all(r.commit and not r.incidents and r.matmuls_checked >= 12 for r in reports)


# ------------------------------------------------------------------------------------------- distributed


def _dist_job(rank: int, world: int, kind: str) -> list[tuple[bool, list[tuple[str, tuple[int, ...]]]]]:
    model = _model()
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    guard = SDCGuard(model, lm_loss, replay_every=0, checksum_every=1, escalate="off")
    out = []
    for step in range(3):
        mode = _fault("transient", "forward" if step == 1 else "backward", 4, rank=1)
        with mode if step > 0 else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            if step > 0:
                mode.step = step
            r = guard.step(step, make_batch(step, rank))
        out.append((r.commit, [(i.kind, i.suspect_ranks) for i in r.incidents]))
    guard.close()
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_a_faulty_rank_is_named_alone_and_every_rank_vetoes(kind: str) -> None:
    results = run_ranks(_dist_job, 2, kind, timeout=200)
    assert results[0] == results[1]
    assert results[0] == [(True, []), (False, [("checksum", (1,))]), (False, [("checksum", (1,))])]


def test_bf16_autocast_names_the_backward_pass_by_the_weight_copy_not_its_shape() -> None:
    # under autocast the backward's dX matmul reads the weight's bf16 copy, not the weight; with a batch of 8 rows
    # and 8x8 layers every result has a weight's shape, so only following the copy tells dX from dW
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))

    def loss_fn(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return m(b).float().square().mean()

    guard = SDCGuard(model, loss_fn, replay_every=0, checksum_every=1)
    passes = []
    for occurrence in range(3):  # the backward's matmuls: the second layer's dX and dW, the first layer's dW
        with _fault("transient", "backward", occurrence, bits="nan") as mode:
            mode.step = occurrence
            r = guard.step(occurrence, torch.randn(8, 8, generator=torch.Generator().manual_seed(occurrence)))
        (inc,) = [i for i in r.incidents if i.kind == "checksum"]
        assert inc.parameter is not None and [i.kind for i in r.incidents] == ["checksum", "nonfinite"]
        passes.append(inc.parameter.split(", ")[-1].rstrip("]"))
    assert sorted(passes) == ["dW", "dW", "dX"]


class _Residual(nn.Module):
    """Matmuls whose added term is not a bias row: ``addmm`` of a full matrix (a fused residual), of a column and
    of a scalar, and ``baddbmm`` of a per-batch matrix and of a shared one: each shape the ops broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) * 0.3)
        self.u = nn.Parameter(torch.randn(2, 8, 8) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(x, x, self.w)  # x + x @ w
        h = torch.addmm(h[:, :1], h, self.w) + torch.addmm(torch.tensor(0.5), h, self.w)
        b = h.reshape(2, -1, 8)
        return torch.baddbmm(b, b, self.u) + torch.baddbmm(b[0], b, self.u)


def test_matmuls_that_add_a_matrix_column_or_scalar_are_checked_and_faults_caught() -> None:
    """An added term that is not a bias row used to break the check (a shape error inside the training step);
    every such call is checked, a clean step commits, and a fault in one of them is caught on its step."""
    torch.manual_seed(0)

    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["x"]).square().mean()

    guard = SDCGuard(_Residual(), loss, replay_every=0, checksum_every=1)
    batch = {"x": torch.randn(64, 8)}
    r = guard.step(0, batch)
    assert r.commit and not r.incidents and r.matmuls_checked == r.matmuls_run == 14  # 5 forward, 9 backward
    mode = _fault("transient", "forward", 0)
    with mode:
        mode.step = 1
        r = guard.step(1, batch)
    assert len(mode.records) == 1 and not r.commit
    assert [i.kind for i in r.incidents] == ["checksum"]


@pytest.mark.parametrize("error", [RuntimeError, ValueError, IndexError, TypeError, AssertionError, ZeroDivisionError])
def test_a_call_the_check_cannot_take_is_counted_unchecked_and_the_step_goes_on(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """Any exception inside a check (only RuntimeError was caught: a ValueError from torch.cat broke the step)."""
    from sdcguard.training.checksums import mode as checksums

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise error("a shape the check does not know")

    monkeypatch.setattr(checksums, "check_matmul", refuse)
    guard = SDCGuard(_model(), lm_loss, replay_every=0, checksum_every=1)
    with expect_log(f"could not check aten.* \\({error.__name__}: .* count as run, not checked"):
        r = guard.step(0, make_batch(0, 0))
    assert r.commit and not r.incidents and r.matmuls_checked == 0 < r.matmuls_run
    assert r.matmuls_unverifiable == 0  # not unverifiable either: only run


class _Experts(nn.Module):
    """A mixture of experts whose router sends no token to the second expert: its matmuls have zero rows."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.empty = nn.Parameter(torch.randn(0, 8))  # and a matmul with k = 0: a weight of no input features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = [x, x[:0]]  # every token to expert 0
        out = torch.cat([e(t) for e, t in zip(self.experts, routed)])
        return out + x[:, :0] @ self.empty  # (n, 0) @ (0, 8): zeros


def test_matmuls_with_zero_rows_or_zero_terms_do_not_break_the_step_and_faults_still_count() -> None:
    """An expert that got no tokens ran a matmul with zero rows: torch.cat raised a ValueError inside the check and
    the step died."""
    torch.manual_seed(0)
    guard = SDCGuard(_Experts(), lambda m, b: m(b).square().mean(), replay_every=0, checksum_every=1)
    x = torch.randn(16, 8)
    with logged() as said:
        r = guard.step(0, x)
    assert said == []  # not even a warning: an empty result is checked (there is nothing in it)
    assert r.commit and not r.incidents and r.matmuls_checked == r.matmuls_run > 0
    mode = _fault("transient", "forward", 0)
    with mode:
        mode.step = 1
        r = guard.step(1, x)
    assert not r.commit and [i.kind for i in r.incidents] == ["checksum"]
