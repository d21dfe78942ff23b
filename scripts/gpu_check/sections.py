"""The sections of a GPU check, in the order they run, with their time limits (the one list of them).

Each section names a function ``(ctx: Context, rep: SectionReport) -> str | None`` that records checks and
measurements on ``rep``, raises :class:`~gpu_check.context.Skip` where its GPU step cannot run, and may return the
sentence a PASS reports. The limits add up to 480 s, so a whole run fits in 8 minutes however each section ends
(what each takes is in results.json; the limits were cut to make room for ``compiled`` and ``hf-fsdp2`` before a GPU
run measured those two). The cheap sections that others build on come first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .context import Context
from .results import SectionReport

__all__ = ["Section", "SECTIONS", "TOTAL_LIMIT_S", "section_by_name", "select"]


@dataclass(frozen=True, kw_only=True)
class Section:
    name: str
    title: str
    """What a PASS proves, in one line."""
    timeout_s: int
    """Wall-clock limit of the section's process (the shell's ``timeout``)."""
    module: str
    """Module (under ``gpu_check``) holding the function that does the work."""
    function: str = "run"
    """That function: ``function(ctx, rep) -> str | None``."""

    def runner(self) -> Callable[[Context, SectionReport], str | None]:
        module = importlib.import_module(f"gpu_check.{self.module}")
        return getattr(module, self.function)


SECTIONS: tuple[Section, ...] = (
    Section(
        name="golden-data",
        timeout_s=10,
        module="golden_data",
        title="the golden data verifies (manifest, every sha256, every reference recomputed)",
    ),
    Section(
        name="nvml",
        timeout_s=30,
        module="nvml_check",
        title="NVML finds the GPUs, tells an idle GPU from a busy one, and reads XID/ECC/remapped-rows telemetry",
    ),
    Section(
        name="golden-suite",
        timeout_s=45,
        module="golden_suite",
        title="every golden family passes on every GPU, with throughput next to cupy.matmul and a device copy",
    ),
    Section(
        name="intrinsics",
        timeout_s=20,
        module="intrinsics",
        title="the intrinsics kernel is repeatable on each GPU; its output is recorded as a golden candidate",
    ),
    Section(
        name="fingerprint",
        timeout_s=35,
        module="fingerprint_check",
        title="the CUDA fingerprint equals the CPU reference over dtypes, shapes and strides; its bandwidth",
    ),
    Section(
        name="training",
        timeout_s=60,
        module="training",
        title="the guard on CUDA tensors, 3 ranks over gloo: calibrate, a clean run, a sticky fault named, a gradient "
        "changed on its way into DDP's all-reduce named",
    ),
    Section(
        name="checksums",
        timeout_s=70,
        module="checksums",
        title="the matmul checksums at torch's defaults in fp32, TF32 and bf16: no false alarm, faults by bit "
        "class, the unverifiable count, a checked step's cost",
    ),
    Section(
        name="compiled",
        timeout_s=60,
        module="compiled",
        title="torch.compile(DDP) on 3 ranks and per-block compiled FSDP2 under the guard, checksums at their "
        "default: bit-identical to unguarded runs, a fault vetoed and named",
    ),
    Section(
        name="hf-fsdp2",
        timeout_s=30,
        module="hf_fsdp2",
        title="the HF callback on a Trainer sharding with Accelerate's FSDP2 plugin: accumulated samples judged, "
        "a fault vetoed and named",
    ),
    Section(
        name="scan",
        timeout_s=45,
        module="fleet",
        function="run_scan",
        title="sdcguard scan --device cuda:0 --budget 30 into a fresh store with telemetry, then report",
    ),
    Section(
        name="drill",
        timeout_s=35,
        module="fleet",
        function="run_drill",
        title="a fire drill on cuda:0 (--inject) finds corruption and quarantines the GPU",
    ),
    Section(
        name="gpu-tests",
        timeout_s=40,
        module="gpu_tests",
        title="the test suite's GPU tests pass (pytest -m gpu), none skipped",
    ),
)

TOTAL_LIMIT_S = sum(s.timeout_s for s in SECTIONS)


def section_by_name(name: str) -> Section:
    """The section called ``name`` (``KeyError`` naming the known ones otherwise)."""
    for s in SECTIONS:
        if s.name == name:
            return s
    raise KeyError(f"no section {name!r}; sections: {', '.join(s.name for s in SECTIONS)}")


def select(only: str | None) -> list[Section]:
    """The sections named in a comma-separated ``only`` list, in run order (every section for None/empty)."""
    if not only:
        return list(SECTIONS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    for n in names:
        section_by_name(n)
    return [s for s in SECTIONS if s.name in names]
