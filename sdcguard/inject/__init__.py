"""Fault injection: a software model of faulty hardware, to prove that corruption is caught.

``sdcguard.inject.faults`` is the fault model (numpy only); ``sdcguard.inject.spec`` the scanner's ``--inject``
fire drill; ``sdcguard.inject.torch_faults`` applies the same model to torch tensors (aten op outputs,
gradients, weights, collectives). Importing this package never imports torch: the torch names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .faults import Fault, FaultModel, FaultRecord
from .spec import INJECT_SPEC_HELP, InjectionHook, InjectRule, InjectSpec, golden_output_hook, parse_inject_spec

_TORCH_NAMES = (
    "OP_FAMILIES",
    "OpFaultMode",
    "TorchFaultRecord",
    "corrupt_tensor_",
    "corrupt_gradients_",
    "corrupt_weights_",
    "corrupt_all_reduce",
    "CorruptingCommHook",
)

__all__ = [
    "Fault",
    "FaultModel",
    "FaultRecord",
    "INJECT_SPEC_HELP",
    "InjectRule",
    "InjectSpec",
    "InjectionHook",
    "golden_output_hook",
    "parse_inject_spec",
]  # the torch names stay out of __all__: `from sdcguard.inject import *` must not import torch


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        value = getattr(importlib.import_module("sdcguard.inject.torch_faults"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
