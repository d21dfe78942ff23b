"""Section ``checksums``: the matmul checksums on a GPU at torch's defaults, in fp32, TF32 and bf16 autocast.

One process, the guard's public API (``sdcguard.SDCGuard(..., replay_every=0, checksum_every=2)``: checked and
unchecked steps alternate, so their times are taken side by side) on a causal transformer on ``cuda:0``, for each
precision in turn (:data:`PRECISIONS`; every other setting left at torch's defaults, bf16's reduced-precision
reductions included):

- ``clean`` clean steps: no checksum alarm (a false alarm is a FAIL), and every matmul of every checked step counted
  checked, unverifiable or run, with the unverifiable ones named (measured: how many, and why);
- transient faults in one matmul output of a checked step, by bit class (:data:`CLASSES`), forward and backward:
  how many were caught on their step (measured; every NaN caught is a check);
- the cost of a checked step against an unchecked one (median of the interleaved steps after a warm-up, each timed
  to a device synchronisation): the figure that answers the open cost goal of the matmul checksums (a checked step
  at most 8% of a step, so the default of one in 4 averages at most 2%).

The same code runs on CPU tensors (``measure(device="cpu", ...)`` with :data:`SMALL`): the tests exercise it without
a GPU, and the dry run walks the section without touching one.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from .context import Context
from .results import SectionReport

__all__ = ["run", "measure", "evaluate", "Settings", "GPU", "SMALL", "PRECISIONS", "CLASSES"]

PRECISIONS = ("fp32", "tf32", "bf16")
"""fp32 (``torch.backends.cuda.matmul.fp32_precision = "ieee"``), TF32 (``"tf32"``, the new API) and bf16 autocast
(fp32 weights, bf16 matmuls)."""

CLASSES = ("sign", "exponent", "high_mantissa", "low_mantissa", "zero", "nan")
"""The bit classes of the injected faults (one flipped bit drawn from the class; ``zero`` and ``nan`` the value)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The model and how much of each measurement to take."""

    d: int
    heads: int
    layers: int
    seq: int
    batch: int
    clean: int
    """Clean steps per precision (half of them checked)."""
    faults: int
    """Faults per bit class and precision."""
    warmup: int = 4
    """Clean steps left out of the timing (CUDA's and cuBLAS's first calls)."""


GPU = Settings(d=1024, heads=16, layers=4, seq=256, batch=16, clean=60, faults=3)
"""On the GPU: 4 layers of width 1024, 16 x 256 tokens a step (matmuls of 4096 rows, k up to 4096)."""
SMALL = Settings(d=16, heads=2, layers=1, seq=8, batch=4, clean=6, faults=1, warmup=2)
"""On CPU tensors in the tests."""


@contextlib.contextmanager
def _precision(torch: Any, precision: str) -> Iterator[bool]:
    """Set the fp32 matmul precision by the new API for the run (yields whether to autocast to bf16); back to
    torch's defaults after."""
    matmul = torch.backends.cuda.matmul
    matmul.fp32_precision = "tf32" if precision == "tf32" else "ieee"
    try:
        yield precision == "bf16"
    finally:
        matmul.fp32_precision = "none"


def _fault(cls: str, seed: int) -> Any:
    from sdcguard.inject import Fault

    if cls in ("zero", "nan"):
        return Fault(pattern=cls, timing="transient", seed=seed)
    return Fault(pattern="bitflip", bit=cls, timing="transient", seed=seed)


def _clean(torch: Any, guard: Any, step_fn: Any, settings: Settings, deadline: float) -> dict[str, Any]:
    """The clean steps: false alarms, the counts of every checked step, the interleaved step times."""
    times: dict[bool, list[float]] = {True: [], False: []}
    alarms, counted, steps = 0, [], 0
    reasons: set[str] = set()
    for step in range(settings.clean):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        report = step_fn(step)
        seconds = time.perf_counter() - t0
        steps += 1
        checked = "checksum" in report.checks
        alarms += sum(1 for i in report.incidents if i.kind == "checksum") + (not report.commit)
        if step >= settings.warmup:
            times[checked].append(seconds)
        if checked:
            counted.append((report.matmuls_run, report.matmuls_checked, report.matmuls_unverifiable))
            reasons.update(line.split(", e.g.")[0] for line in report.unverifiable)
    checked_s, plain_s = (statistics.median(times[c]) if times[c] else None for c in (True, False))
    return {
        "steps": steps,
        "false_alarms": alarms,
        "counts": counted[-1] if counted else None,
        "counts_add_up": bool(counted) and all(c + u <= r and r > 0 for r, c, u in counted),
        "unverifiable": sorted(reasons),
        "checked_step_ms": None if checked_s is None else round(1e3 * checked_s, 3),
        "unchecked_step_ms": None if plain_s is None else round(1e3 * plain_s, 3),
        "cost": None if not (checked_s and plain_s) else round(checked_s / plain_s - 1, 4),
    }


def _faults(guard: Any, step_fn: Any, settings: Settings, run: int, deadline: float) -> dict[str, Any]:
    """Transient faults in one matmul output of a checked step, by bit class: ``[injected, caught]`` each."""
    from sdcguard.inject.torch_faults import OpFaultMode

    out = {cls: [0, 0] for cls in CLASSES}
    step = settings.clean + settings.clean % 2  # checked steps are the even ones (checksum_every=2)
    for i in range(settings.faults):
        for cls in CLASSES:
            if time.monotonic() > deadline:
                return out
            mode = OpFaultMode(_fault(cls, 100 * i + len(cls)), ops="matmul", occurrence=(7 * i + 3) % max(1, run))
            mode.step = step
            with mode:
                report = step_fn(step)
            step += 2
            if mode.records:
                out[cls][0] += 1
                out[cls][1] += any(x.kind == "checksum" for x in report.incidents)
            step_fn(step - 1)  # the unchecked step between (keeps the optimizer's pace; not a measurement)
    return out


def measure(*, device: str, precision: str, settings: Settings, deadline: float) -> dict[str, Any]:
    """One precision's findings on ``device`` (``cuda:0`` or ``cpu``), within ``deadline`` (``time.monotonic()``)."""
    import torch

    import sdcguard
    from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

    dev = torch.device(device)
    torch.manual_seed(0)
    model = TinyTransformer(d=settings.d, heads=settings.heads, layers=settings.layers, seq=settings.seq, p=0.0)
    model = model.to(dev)
    with _precision(torch, precision) as bf16:

        def loss_fn(m: Any, b: Any) -> Any:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                return lm_loss(m, b)

        guard = sdcguard.SDCGuard(
            model, loss_fn, replay_every=0, weight_check_every=0, checksum_every=2, escalate="off"
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step_fn(step: int) -> Any:
            batch = {k: v.to(dev) for k, v in make_batch(step, 0, batch=settings.batch, seq=settings.seq).items()}
            report = guard.step(step, batch)
            if report.commit:
                opt.step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return report

        # the clean steps may take half the time left: the H200 run of 2026-12-04 spent it all on them (72 of 240
        # steps in a 13 s share) and injected no fault
        clean = _clean(torch, guard, step_fn, settings, time.monotonic() + (deadline - time.monotonic()) / 2)
        run = clean["counts"][0] if clean["counts"] else 1
        faults = _faults(guard, step_fn, settings, run, deadline)
    return {"precision": precision, "settings": asdict(settings), **clean, "faults": faults}


def evaluate(rep: SectionReport, found: list[dict[str, Any]]) -> None:
    """The section's checks over each precision's findings; the figures are recorded as measurements."""
    for f in found:
        p = f["precision"]
        rep.check(f"{p}: {f['steps']} clean steps, no checksum alarm", f["steps"] > 0 and not f["false_alarms"])
        rep.check(
            f"{p}: every matmul of a checked step counted checked, unverifiable or run",
            f["counts_add_up"],
            "run {}, checked {}, unverifiable {}".format(*f["counts"]) if f["counts"] else "no checked step",
        )
        injected = sum(n for n, _ in f["faults"].values())
        rep.check(f"{p}: faults were injected into matmul outputs", injected > 0, f"{injected} faults")
        nan = f["faults"]["nan"]
        if f["counts"] and not f["counts"][1]:  # every matmul unverifiable: the checksums see none of them
            rep.say(f"  {p}: no matmul checked at torch's defaults (all unverifiable), so no NaN is theirs to catch")
        else:
            caught = nan[0] > 0 and nan[1] == nan[0]
            rep.check(f"{p}: every NaN in a matmul output caught on its step", caught, f"{nan}")
        rep.measure(p, f)
        by = ", ".join(f"{c} {hit}/{n}" for c, (n, hit) in f["faults"].items())
        cost = "n/a" if f["cost"] is None else f"{100 * f['cost']:+.1f}%"
        rep.say(
            f"  {p}: checked {f['counts'][1] if f['counts'] else 0} / unverifiable "
            f"{f['counts'][2] if f['counts'] else 0} / run {f['counts'][0] if f['counts'] else 0} matmuls; "
            f"caught {by}; a checked step {cost} against an unchecked one"
        )
        for reason in f["unverifiable"]:
            rep.say(f"    unverifiable: {reason}")


def run(ctx: Context, rep: SectionReport) -> str | None:
    import torch

    import sdcguard.training.checksums as checksums

    rep.check("the checksum dispatch mode imports", hasattr(checksums, "ChecksumMode"), f"torch {torch.__version__}")
    ctx.require_gpu(
        f"check every matmul of {GPU.clean // 2} clean checked steps and {len(CLASSES) * GPU.faults} faulty ones on "
        f"cuda:{ctx.device} in {', '.join(PRECISIONS)} at torch's defaults, and time a checked step against an "
        "unchecked one"
    )
    if not rep.check("torch sees CUDA", torch.cuda.is_available(), f"CUDA {torch.version.cuda}"):
        return None
    found = []
    for i, p in enumerate(PRECISIONS):
        share = ctx.left() / (len(PRECISIONS) - i)  # what is left, shared by the precisions still to run
        found.append(measure(device=f"cuda:{ctx.device}", precision=p, settings=GPU, deadline=time.monotonic() + share))
    evaluate(rep, found)
    costs = ", ".join(f"{f['precision']} {100 * f['cost']:+.1f}%" for f in found if f["cost"] is not None)
    return f"no false alarm, every NaN caught, in {', '.join(PRECISIONS)}; a checked step costs {costs}"
