"""How the backend computes a matmul, read from torch's settings: the unit roundoffs the checksum bound
(:mod:`.bound`) models, and which setting made each one what it is.

Every precision flag torch has is read, through the old API and the new one, and a read never raises: torch raises
when the legacy getter (``torch.get_float32_matmul_precision()``, ``allow_tf32``) is asked after the new API
(``torch.backends.cuda.matmul.fp32_precision = "tf32"``, ``torch.backends.mkldnn.matmul.fp32_precision``,
``torch.backends.fp32_precision``) was used, so the per-backend value of the new API is read first (the legacy
setter writes it too), the generic value where it says ``"none"``, the legacy getter only where neither can be
read, and a precision that cannot be read at all, or a value torch may add later, is taken as the least precise one
known (bf16 internal precision): wider, never unsound.

- **fp32 operands** (:func:`fp32_internal`): ``ieee`` / ``highest`` keeps them; ``tf32`` / ``high`` keeps 10
  mantissa bits, ``bf16`` / ``medium`` 7 (truncation allowed for: ``2**-10``, ``2**-7``). The check's own fp32
  matmuls run under the same setting (``u_ref``).
- **bf16 / fp16 results on CUDA**: ``allow_bf16_reduced_precision_reduction`` /
  ``allow_fp16_reduced_precision_reduction`` (on by default) let cuBLAS(Lt) add a split-K matmul's partial sums in
  the output type (``CUBLASLT_REDUCTION_SCHEME_INPLACE`` / ``OUTPUT_TYPE``; torch forbids them by restricting the
  reduction scheme to ``COMPUTE_TYPE``, and forbids split-K with the tuple form ``(False, False)``). Each partial
  sum is still accumulated in fp32 (the compute type): the reduction is a few partial sums rounded to the output,
  not ``k`` roundings. No library documents the largest split count it picks; the bound takes it as a parameter
  (``splits``, default :data:`DEFAULT_SPLITS`, at most the number of terms).
- **fp16 accumulation** (``allow_fp16_accumulation``, off by default): cuBLAS accumulates fp16 matmuls in fp16
  (``CUBLAS_COMPUTE_16F``), every one of the ``k`` additions rounded to fp16.
- **Tensor cores** (every CUDA matmul is assumed to run on them): they add a block of products by aligning their
  significands to the largest exponent and truncating, not rounding (Fasi, Higham, Mikaitis, Pranesh, "Numerical
  behavior of NVIDIA tensor cores", PeerJ CS 2021). The bound models that (``truncating``), for the checked matmul
  and the check's own.

The arithmetic of each combination is cached; the flags are read on every call (they may change between steps).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Precision", "precision_for", "fp32_internal", "DEFAULT_SPLITS", "UNITS"]

DEFAULT_SPLITS = 32
"""Partial sums a split-K matmul is assumed to add in its output type when reduced-precision reductions are allowed.
cuBLASLt's own split-K examples go up to 32; a matmul has no more partial sums than terms, so the bound takes the
smaller of this and ``k``."""

UNITS = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
"""Unit roundoff of each dtype the bound knows."""

_INTERNAL = {"highest": 0.0, "high": 2.0**-10, "medium": 2.0**-7}
"""An fp32 matmul's operand rounding at each legacy precision name (truncation allowed for)."""
_NEW_API = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


@dataclass(frozen=True)
class Precision:
    """Unit roundoffs of one matmul as the backend computes it (see :mod:`.bound`'s theorem)."""

    u_in: float
    """Operand rounding before the products (TF32: 2**-10, bf16 internal precision: 2**-7, truncation allowed
    for; else 0)."""
    u_acc: float
    """Accumulation unit of the products (fp32: 2**-24; fp16 with ``allow_fp16_accumulation``)."""
    u_out: float
    """Rounding of the result to the output dtype (0 when the output is the accumulation dtype)."""
    u_ref: float
    """Operand rounding of the check's own fp32 matmuls (the same setting as ``u_in`` of an fp32 matmul)."""
    tiny_out: float = 0.0
    """Smallest normal number of the output dtype (each output rounding may flush up to it)."""
    tiny_in: float = 0.0
    """Smallest normal number of the operands (a flushed operand loses up to it times the other)."""
    u_red: float = 0.0
    """Unit of a split-K reduction of partial sums (the output's with reduced-precision reductions; else 0)."""
    splits: int = DEFAULT_SPLITS
    """The most partial sums such a reduction adds (each rounded to the output, then added in it)."""
    truncating: bool = False
    """fp32 (or fp16) accumulation aligns and truncates (tensor cores), for the matmul and the check's own."""
    setting: str = ""
    """The settings that made these units what they are (named in warnings), e.g.
    ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction=True``."""


def _read(getter: Callable[[], object]) -> str | None:
    """A setting as a string, or None where reading it raises (torch's mixed-API error, a flag this torch lacks)."""
    try:
        return str(getter())
    except Exception:
        return None


def fp32_internal(device_type: str) -> tuple[str, str]:
    """How an fp32 matmul on ``device_type`` rounds its operands: ``highest`` (not at all), ``high`` (TF32) or
    ``medium`` (bf16), and the setting that says so. Never raises (see the module docstring)."""
    where = "torch.backends.cuda.matmul" if device_type == "cuda" else "torch.backends.mkldnn.matmul"
    # getattr: these attributes are set on torch's backend modules at run time (and absent from older torch)
    backend = torch.backends.cuda if device_type == "cuda" else torch.backends.mkldnn
    own = _read(lambda: getattr(getattr(backend, "matmul"), "fp32_precision"))  # noqa: B009
    generic = _read(lambda: getattr(torch.backends, "fp32_precision"))  # noqa: B009
    if own is not None and own != "none":
        value, said = own, f"{where}.fp32_precision={own!r}"
    elif own is not None and generic is not None:
        value = "ieee" if generic == "none" else generic
        said = f"torch.backends.fp32_precision={generic!r}"
    else:
        legacy = _read(torch.get_float32_matmul_precision)
        if legacy is None:
            return "medium", "the fp32 matmul precision cannot be read (assumed bf16 internal precision)"
        if (
            device_type == "cuda"
            and legacy == "highest"
            and _read(lambda: torch.backends.cuda.matmul.allow_tf32) != "False"
        ):
            legacy = "high"
        return (legacy if legacy in _INTERNAL else "medium"), f"torch.get_float32_matmul_precision()={legacy!r}"
    mode = _NEW_API.get(value, "medium")  # a value this code does not know: the least precise one it does
    return mode, said


def precision_for(dtype: torch.dtype, device: torch.device, *, splits: int = DEFAULT_SPLITS) -> Precision | None:
    """The :class:`Precision` of a matmul of ``dtype`` operands (and result) on ``device`` under the current
    settings; None for a dtype it cannot bound. ``splits``: see :data:`DEFAULT_SPLITS`. Never raises."""
    if dtype not in UNITS:
        return None
    reduced = fp16_acc = False
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        name = "bf16" if dtype == torch.bfloat16 else "fp16"
        # unreadable: allowed (the default, and the wider bound)
        reduced = _read(lambda: getattr(torch.backends.cuda.matmul, f"allow_{name}_reduced_precision_reduction")) in (
            None,
            "True",
        )
        if dtype == torch.float16:
            fp16_acc = _read(lambda: torch.backends.cuda.matmul.allow_fp16_accumulation) == "True"
    mode, said = fp32_internal(device.type)
    return _precision(dtype, mode, said, reduced, fp16_acc, device.type == "cuda", max(1, splits))


@functools.lru_cache(maxsize=256)
def _precision(
    dtype: torch.dtype, mode: str, said: str, reduced: bool, fp16_acc: bool, cuda: bool, splits: int
) -> Precision:
    ref = _INTERNAL[mode]
    tiny = torch.finfo(dtype).tiny
    settings = [said] if ref else []
    if dtype in (torch.float32, torch.float64):
        return Precision(
            u_in=ref if dtype == torch.float32 else 0.0,
            u_acc=UNITS[dtype],
            u_out=0.0,
            u_ref=ref,
            tiny_out=tiny,
            tiny_in=tiny,
            truncating=cuda,
            setting="; ".join(settings),
        )
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    if reduced:
        settings.append(f"torch.backends.cuda.matmul.allow_{name}_reduced_precision_reduction=True")
    if fp16_acc:
        settings.append("torch.backends.cuda.matmul.allow_fp16_accumulation=True")
    return Precision(
        u_in=0.0,
        u_acc=UNITS[dtype] if fp16_acc else UNITS[torch.float32],
        u_out=UNITS[dtype],
        u_ref=ref,
        tiny_out=tiny,
        tiny_in=tiny,
        u_red=UNITS[dtype] if reduced else 0.0,
        splits=splits,
        truncating=cuda,
        setting="; ".join(settings),
    )
