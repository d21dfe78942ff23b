"""The aten ops a fault can be injected into, by family (``matmul``, ``attention``, ...), and the one way a name
(a family, an op, ``aten.<op>``) resolves to overload packets."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import BadInput

__all__ = ["OP_FAMILIES", "resolve_ops"]

_SDPA = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward",
    "_flash_attention_backward",
    "_efficient_attention_forward",
    "_efficient_attention_backward",
)
_SOFTMAX = ("_softmax", "_safe_softmax", "_softmax_backward_data")

OP_FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "linear", "matmul", "_scaled_mm"),
    # The math path of scaled_dot_product_attention is bmm + softmax, so attention includes the softmax ops.
    "attention": (*_SDPA, *_SOFTMAX),
    "softmax": _SOFTMAX,
    "norm": (
        "native_layer_norm",
        "native_layer_norm_backward",
        "native_batch_norm",
        "native_batch_norm_backward",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "native_group_norm",
        "native_group_norm_backward",
        "_fused_rms_norm",
        "_fused_rms_norm_backward",
    ),
    "activation": (
        "gelu",
        "gelu_backward",
        "relu",
        "threshold_backward",
        "silu",
        "silu_backward",
        "tanh",
        "tanh_backward",
        "sigmoid",
        "sigmoid_backward",
    ),
    "embedding": ("embedding", "embedding_dense_backward"),
    # cross_entropy = _log_softmax + nll_loss
    "loss": (
        "nll_loss_forward",
        "nll_loss_backward",
        "nll_loss2d_forward",
        "nll_loss2d_backward",
        "_log_softmax",
        "_log_softmax_backward_data",
        "mse_loss",
        "mse_loss_backward",
        "binary_cross_entropy",
        "binary_cross_entropy_backward",
        "binary_cross_entropy_with_logits",
    ),
}
"""Op families by name: overload packets of ``torch.ops.aten`` (both forward and backward ops)."""


def resolve_ops(ops: str | Iterable[str]) -> frozenset[str]:
    """The overload packet names ``ops`` stands for (a family of :data:`OP_FAMILIES`, an op, or a list)."""
    import torch

    names = [ops] if isinstance(ops, str) else list(ops)
    if not names:
        raise BadInput("no op to corrupt: name an op family or aten ops")
    out: set[str] = set()
    for name in names:
        if name in OP_FAMILIES:
            out.update(OP_FAMILIES[name])
            continue
        op = name.removeprefix("aten.").removeprefix("aten::").split(".")[0]
        if not hasattr(torch.ops.aten, op):
            raise BadInput(f"unknown op {name!r}: use a family ({', '.join(OP_FAMILIES)}) or an aten op name")
        out.add(op)
    return frozenset(out)
