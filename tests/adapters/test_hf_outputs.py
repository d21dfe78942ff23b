"""The Hugging Face callback reads a model's loss the way the ``Trainer`` does: from a ``ModelOutput``, a plain
``dict`` or the first element of a tuple. A model returning a dict used to crash every process at its first replay
(``AttributeError: 'dict' object has no attribute 'loss'``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("accelerate", reason="accelerate (the Trainer needs it) is not installed")

from sdcguard.adapters.hf import SDCGuardTrainerCallback, model_output_loss, output_loss  # noqa: E402


class _Regression(torch.nn.Module):
    """A model computing its own loss, returning it as ``kind`` says."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Any:
        loss = torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)
        if self.kind == "dict":
            return {"loss": loss, "logits": x}
        if self.kind == "tuple":
            return (loss, x)
        return transformers.modeling_outputs.SequenceClassifierOutput(loss=loss, logits=x)


@pytest.mark.parametrize("kind", ["dict", "tuple", "model_output"])
def test_the_replay_loss_is_read_from_every_output_the_trainer_accepts(kind: str) -> None:
    model = _Regression(kind)
    batch = {"x": torch.ones(2, 4), "labels": torch.zeros(2)}
    expected = torch.nn.functional.mse_loss(model.lin(batch["x"]).squeeze(-1), batch["labels"])
    assert torch.equal(model_output_loss(model, batch), expected)


def test_an_output_without_a_loss_is_none_and_a_replay_says_so() -> None:
    assert output_loss({"logits": torch.ones(1)}) is None
    assert output_loss(()) is None
    assert output_loss(object()) is None

    class NoLoss(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return {"logits": x}

    with pytest.raises(TypeError, match="no loss"):
        model_output_loss(NoLoss(), {"x": torch.ones(1)})


@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_a_trainer_whose_model_returns_a_dict_or_tuple_is_guarded_and_replayed(kind: str, tmp_path: Path) -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rows = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(12)]
    cb = SDCGuardTrainerCallback(replay_every=1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    transformers.Trainer(model=_Regression(kind), args=args, train_dataset=rows, callbacks=[cb]).train()
    assert cb.guard is not None and cb.last_report is not None
    assert cb.last_report.replayed and cb.last_report.commit
    assert cb.guard.incidents == []
