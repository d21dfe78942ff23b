"""Turning a kernel-run case's buffers into a :class:`~sdcguard.records.CaseResult`: shared by the CuPy backend
(buffers copied back from a GPU) and the host build (the same kernels compiled for the CPU).

A mismatch is located on the SM of the block that wrote the element (``plan.element_block`` into the ``smids``
buffer every kernel fills); a memory march's in-kernel error record carries its own SM and a second read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SuiteError
from ..records import CaseResult
from .bits import failure_digest, hex_bits
from .cases import Case
from .compare import compare_bits
from .launch import Plan

__all__ = ["kernel_case_result", "march_error"]


def march_error(err: np.ndarray, plan: Plan) -> dict[str, Any] | None:
    """The memory march's error record as a dict (None when every read matched)."""
    count = int(err[0])
    if count == 0:
        return None
    phase = int(err[8])
    return {
        "count": count,
        "element": int(err[1]) | (int(err[2]) << 32),
        "expected": int(err[3]),
        "actual": int(err[4]),
        "second_read": int(err[5]),
        "sm": int(err[6]),
        "phase": plan.launches[phase].phase if phase < len(plan.launches) else str(phase),
    }


def kernel_case_result(
    *,
    case: Case,
    plan: Plan,
    expected: np.ndarray,
    golden_digest: str,
    host: dict[str, np.ndarray],
    output_hook: Callable[[str, np.ndarray], np.ndarray] | None,
    device: str,
    started: float,
    duration: float,
    reread: Callable[[int], int] | None = None,
    detail: dict[str, Any] | None = None,
) -> CaseResult:
    """Compare the output buffer with the golden and build the result (hook applied first)."""
    output = host[plan.output][: case.size].reshape(case.shape)
    if output_hook is not None:
        output = output_hook(case.id, output)
        if not isinstance(output, np.ndarray):
            raise SuiteError(f"output hook returned {type(output).__name__} for {case.id}, not an ndarray")
    mismatch = compare_bits(expected, output)
    march = march_error(host["err"], plan) if "err" in host else None
    if mismatch is None and march is None:
        return CaseResult(
            device=device,
            case=case.id,
            family=case.family,
            seed=case.seed,
            passed=True,
            duration_s=duration,
            started_at=started,
            output_digest=golden_digest,
            detail=dict(detail or {}),
        )
    size = expected.dtype.itemsize
    info: dict[str, Any] = {"dtype": case.dtype, "out_dtype": case.out_dtype, **(detail or {})}
    element, count, exp_hex, act_hex, xor_hex, location = _where_wrong(
        case, plan, expected, host, mismatch, march, reread, info
    )
    if march is not None:
        info["march"] = {
            **march,
            "expected": hex_bits(march["expected"], size),
            "actual": hex_bits(march["actual"], size),
            "second_read": hex_bits(march["second_read"], size),
            "stored_value_corrupt": march["second_read"] != march["expected"],
        }
    return CaseResult(
        device=device,
        case=case.id,
        family=case.family,
        seed=case.seed,
        passed=False,
        duration_s=duration,
        started_at=started,
        mismatches=count,
        output_digest=failure_digest(
            output, None if march is None else (march["element"], march["expected"], march["actual"])
        ),
        element=element,
        expected=exp_hex,
        actual=act_hex,
        xor_mask=xor_hex,
        location=location,
        detail=info,
    )


def _where_wrong(
    case: Case,
    plan: Plan,
    expected: np.ndarray,
    host: dict[str, np.ndarray],
    mismatch: Any,
    march: dict[str, Any] | None,
    reread: Callable[[int], int] | None,
    info: dict[str, Any],
) -> tuple[int, int, str, str, str, str]:
    """The first wrong element of a failed case: ``(element, count, expected, actual, xor mask, location)``, with
    what locates it added to ``info`` (its block and SM, its row and column, a memory case's second read)."""
    size = expected.dtype.itemsize
    smids = host["smids"]
    if mismatch is None:
        assert march is not None
        exp_hex, act_hex = hex_bits(march["expected"], size), hex_bits(march["actual"], size)
        xor_hex = hex_bits(march["expected"] ^ march["actual"], size)
        return march["element"], march["count"], exp_hex, act_hex, xor_hex, f"sm:{march['sm']}"
    element, count = mismatch.element, mismatch.count
    block = plan.element_block(element)
    location = f"sm:{int(smids[block])}" if block is not None else "sm:*"
    if block is None:
        info["sms"] = sorted({int(s) for s in smids})  # every block contributed to this element
    else:
        info["block"] = block
    if len(case.shape) == 2:
        info["row"], info["col"] = divmod(element, case.shape[1])
    if case.family == "memory" and reread is not None:
        second = reread(element)
        info["second_read"] = hex_bits(second, size)
        info["stored_value_corrupt"] = second != int(expected.reshape(-1).view(f"u{size}")[element])
    return element, count, mismatch.expected, mismatch.actual, mismatch.xor_mask, location
