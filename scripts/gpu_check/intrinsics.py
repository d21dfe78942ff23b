"""Section ``intrinsics``: the fast-intrinsics kernel on every GPU, recorded as a per-architecture golden candidate.

``intrinsics.fp32.fast`` (``__expf __logf __sinf __cosf __fdividef``) has no reference arithmetic: its golden is
what healthy GPUs of one architecture compute, and :data:`sdcguard.golden.candidates.RULE` says when one counts.
So on each GPU the kernel runs twice (the outputs must be bit-identical), its values must lie within the
intrinsics' error bounds of float64 math (a sanity bound, far looser than their documented ulp errors: it catches
a broken kernel or layout, not a subtly wrong device), and where the suite already holds a golden for the
architecture they must match it. The outputs go to ``<out>/intrinsics-<arch>.json``, a candidate file to commit
(``benchmarks/gpu_check/``); once a second device of the architecture agrees, ``python -m gpu_check promote``
records the golden into ``golden_vectors/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .context import Context
from .results import SectionReport

__all__ = ["run", "CASE_ID", "accuracy", "TOLERANCE", "record_candidates"]

CASE_ID = "intrinsics.fp32.fast"

TOLERANCE = 1e-4
"""Largest error accepted against float64 math: relative for exp and divide, absolute for log, sin and cos."""


def accuracy(output: np.ndarray, inputs: dict[str, np.ndarray]) -> dict[str, float]:
    """Worst error of each of the 5 output rows against float64 math (relative or absolute, see TOLERANCE)."""
    x = inputs["x"].astype(np.float64)
    y = inputs["y"].astype(np.float64)
    got = output.astype(np.float64)
    with np.errstate(all="ignore"):
        return {
            "__expf": float(np.nanmax(np.abs(got[0] - np.exp(x)) / np.exp(x))),
            "__logf": float(np.nanmax(np.abs(got[1] - np.log(y)))),
            "__sinf": float(np.nanmax(np.abs(got[2] - np.sin(x)))),
            "__cosf": float(np.nanmax(np.abs(got[3] - np.cos(x)))),
            "__fdividef": float(np.nanmax(np.abs(got[4] - x / y) / np.maximum(np.abs(x / y), 1e-30))),
        }


def record_candidates(out: Path, cands: list[Any]) -> dict[str, dict[str, Any]]:
    """Write one candidate file per architecture into ``out``; what was written, per architecture."""
    from sdcguard.golden.candidates import MIN_DEVICES, write_candidates

    by_arch: dict[str, list[Any]] = {}
    for c in cands:
        by_arch.setdefault(c.arch, []).append(c)
    written = {}
    for arch, group in sorted(by_arch.items()):
        path = write_candidates(out / f"intrinsics-{arch}.json", group)
        devices = sorted({c.device for c in group})
        written[arch] = {
            "file": path.name,
            "devices": devices,
            "sha256": sorted({c.sha256 for c in group}),
            "promotable": len(devices) >= MIN_DEVICES and len({c.sha256 for c in group}) == 1,
        }
    return written


def run(ctx: Context, rep: SectionReport) -> str:
    from sdcguard.golden import case_by_id, default_suite
    from sdcguard.golden.candidates import RULE

    case = case_by_id(CASE_ID)
    suite = default_suite()
    inputs = suite.inputs(case)  # rebuilt from the seed and checked against the manifest's sha256
    rep.check("the intrinsics case's inputs rebuild from its seed", set(inputs) >= {"x", "y"})
    rep.say(f"  rule: {RULE}")
    ctx.require_gpu(f"run {CASE_ID} twice on every GPU and write {ctx.out}/intrinsics-<arch>.json")
    import cupy as cp

    from sdcguard.golden import CupyBackend
    from sdcguard.golden.candidates import candidate

    cands = []
    for index in range(cp.cuda.runtime.getDeviceCount()):
        backend = CupyBackend(index)
        first, second = backend.output(case), backend.output(case)
        name = f"cuda:{index} ({backend.arch})"
        rep.check(f"{name} repeats itself bit for bit", np.array_equal(first.view(np.uint32), second.view(np.uint32)))
        errors = accuracy(first, inputs)
        worst = max(errors, key=lambda k: errors[k])
        rep.check(
            f"{name} is within {TOLERANCE:g} of float64 math",
            errors[worst] <= TOLERANCE,
            f"worst {worst} {errors[worst]:.2e}",
        )
        rep.measure(f"cuda:{index}", {"device": backend.device, "arch": backend.arch, "errors": errors})
        if (case.id, backend.arch) in suite.arch_entries:
            r = backend.run(case)
            rep.check(
                f"{name} matches the recorded {backend.arch} golden",
                r.passed,
                "" if r.passed else f"element {r.element} xor {r.xor_mask} at {r.location}",
            )
        cands.append(candidate(case, backend.arch, backend.device, first, model=backend.model))
        backend.close()
    written = rep.measure("candidates", record_candidates(ctx.out, cands))
    for arch, w in written.items():
        if len(w["devices"]) > 1:
            rep.check(f"the {len(w['devices'])} GPUs of {arch} agree", len(w["sha256"]) == 1)
    return "; ".join(
        f"{arch}: candidate from {len(w['devices'])} device(s) in {w['file']}"
        + (" (promotable now)" if w["promotable"] else " (a golden needs a second device that agrees)")
        for arch, w in written.items()
    )
