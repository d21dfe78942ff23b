"""``from sdcguard.adapters.hf import SDCGuardTrainerCallback`` (defined in :mod:`sdcguard.training.adapters.hf`)."""

from ..training.adapters.hf import RECORD, SDCGuardTrainerCallback, model_output_loss

__all__ = ["SDCGuardTrainerCallback", "model_output_loss", "RECORD"]
