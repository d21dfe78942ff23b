"""Section ``training``: the training guard on CUDA tensors, 3 ranks sharing one GPU over gloo.

NCCL refuses two ranks on one device, so the ranks talk over gloo while every tensor of the model lives on
``cuda:0``. Each rank sets ``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG``, then for
fp32 and for bf16 autocast in turn builds a guard with the public API (``sdcguard.SDCGuard(..., replay_every=1,
weight_check_every=1, on_detect="skip")``) and checks:

- ``guard.calibrate(batch)`` reports bit-identical replays on every rank;
- ``CLEAN_STEPS`` clean steps commit on every rank with zero incidents (replays and weight checks included);
- a sticky fault (``OpFaultMode``: a flipped high-mantissa bit in every matmul output of rank ``FAULTY_RANK`` during
  one step) is caught at that step: no rank commits it, and the incident names rank ``FAULTY_RANK`` alone and its
  device (``GPU-<uuid>`` on a GPU);
- the next clean step commits again;
- the gradient's path into DDP's all-reduce is checked on every step (``reduction`` among the step's checks), and a
  gradient changed on rank ``FAULTY_RANK`` by a tensor hook registered after the guard's (one element plus 1e-3, at
  step ``PATH_STEP``) is vetoed on every rank and names that rank alone: the comm hook's fingerprint of the bucket
  on the device against the tensor hook's.

The same job runs on CPU tensors too (``run_job(device="cpu")``): the tests exercise this module without a GPU.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from typing import Any

from sdcguard.testing import RankFailed, run_ranks

from .context import Context
from .results import SectionReport

__all__ = [
    "run",
    "run_job",
    "evaluate",
    "WORLD",
    "FAULTY_RANK",
    "CLEAN_STEPS",
    "PATH_STEP",
    "STEPS",
    "PRECISIONS",
    "CUBLAS_WORKSPACE",
]

WORLD = 3
FAULTY_RANK = 1
CLEAN_STEPS = 3
PATH_STEP = CLEAN_STEPS + 2
"""The step whose gradient a hook registered after the guard's changes on rank ``FAULTY_RANK``."""
STEPS = PATH_STEP + 2
PRECISIONS = ("fp32", "bf16")
CUBLAS_WORKSPACE = ":4096:8"


def _model(torch: Any) -> Any:
    """Dropout on the input (CUDA random numbers the replay must reproduce), then linear, layer norm, GELU,
    linear: every matmul output reaches the loss, so a corrupted one always shows."""
    from torch import nn

    return nn.Sequential(nn.Dropout(0.1), nn.Linear(32, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 16))


class _Loss:
    """``loss_fn(model, batch)``: cross-entropy, the forward under bf16 autocast when asked."""

    def __init__(self, precision: str, device_type: str) -> None:
        self.bf16 = precision == "bf16"
        self.device_type = device_type

    def __call__(self, model: Any, batch: dict[str, Any]) -> Any:
        import torch
        from torch.nn import functional as F

        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = model(batch["x"])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch["y"].reshape(-1))


def _batch(torch: Any, step: int, rank: int, device: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {
        "x": torch.randn(8, 4, 32, generator=g).to(device),
        "y": torch.randint(0, 16, (8, 4), generator=g).to(device),
    }


def _incidents(found: Any) -> list[dict[str, Any]]:
    return [
        {"kind": i.kind, "step": i.step, "suspect_ranks": list(i.suspect_ranks), "device": i.device, "sticky": i.sticky}
        for i in found
    ]


def _one_precision(torch: Any, rank: int, device: Any, precision: str) -> dict[str, Any]:
    import sdcguard
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode

    torch.manual_seed(0)  # the same initial weights on every rank
    model = _model(torch).to(device)
    # escalate="off": the sticky fault is named and vetoed, and the run goes on to show the next step commits
    guard = sdcguard.SDCGuard(
        model, _Loss(precision, device.type), replay_every=1, weight_check_every=1, on_detect="skip", escalate="off"
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    box = {"step": -1}

    def bump(grad: Any) -> Any:  # after the guard's hook: the guard saw the clean gradient, DDP reduces this one
        if box["step"] != PATH_STEP:
            return None
        out = grad.clone()
        out.view(-1)[0] += 1e-3
        return out

    if rank == FAULTY_RANK:
        model[1].weight.register_hook(bump)
    torch.manual_seed(100 + rank)  # each rank's dropout stream differs, as in a real job
    cal = guard.calibrate(_batch(torch, 0, rank, device))
    steps = []
    for step in range(STEPS):  # clean steps, the faulty step, a clean one, the changed gradient, a clean one
        box["step"] = step
        mode = None
        if step == CLEAN_STEPS:
            mode = OpFaultMode(
                Fault(pattern="bitflip", bit="high_mantissa", timing="sticky", seed=step),
                ops="matmul",
                phase="forward",
                rank=FAULTY_RANK,
                steps=[step],
            )
            mode.step = step
        t0 = time.perf_counter()
        with mode if mode is not None else nullcontext():
            report = guard.step(step, _batch(torch, step, rank, device))
        if report.commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        weights = guard.after_optimizer_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        steps.append(
            {
                "step": step,
                "commit": bool(report.commit),
                "incidents": _incidents(report.incidents),
                "weight_incidents": _incidents(weights),
                "seconds": time.perf_counter() - t0,
                "injected": len(mode.records) if mode is not None else 0,
                "checks": list(report.checks),
            }
        )
    return {
        "calibration": {"deterministic": bool(cal.deterministic), "text": str(cal)},
        "steps": steps,
        "incidents": len(guard.incidents),
        "param_device": str(next(model.parameters()).device),
    }


def _rank_job(rank: int, world: int, device_type: str) -> dict[str, Any]:
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    return {p: _one_precision(torch, rank, device, p) for p in PRECISIONS}


def run_job(*, device: str, timeout: float) -> list[dict[str, Any]]:
    """Every rank's findings (rank order) for a job on ``device`` (``cuda`` or ``cpu``); ``RankFailed`` if a rank
    fails or the job outlives ``timeout``."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE  # before the ranks start: they inherit it
    return run_ranks(_rank_job, WORLD, device, timeout=timeout)


def evaluate(rep: SectionReport, ranks: list[dict[str, Any]], *, device: str, device_prefix: str) -> None:
    """The checks of the module docstring over every rank's findings: the parameters were on ``device`` (``cuda:0``),
    the suspect's device id starts with ``device_prefix`` (``GPU-`` on a GPU)."""
    for p in PRECISIONS:
        per = [r[p] for r in ranks]
        rep.check(
            f"{p}: the model lives on {device} on every rank",
            all(x["param_device"] == device for x in per),
            ", ".join(sorted({x["param_device"] for x in per})),
        )
        rep.check(
            f"{p}: calibrate() finds replays bit-identical on every rank",
            all(x["calibration"]["deterministic"] for x in per),
            per[0]["calibration"]["text"],
        )
        clean = [s for x in per for s in x["steps"] if s["step"] not in (CLEAN_STEPS, PATH_STEP)]
        noisy = [s for s in clean if not s["commit"] or s["incidents"] or s["weight_incidents"]]
        rep.check(
            f"{p}: {len(clean) // WORLD} clean steps commit with zero incidents on every rank",
            not noisy,
            f"first noisy: step {noisy[0]['step']} {noisy[0]['incidents'] or noisy[0]['weight_incidents']}"
            if noisy
            else "",
        )
        faulty = [next(s for s in x["steps"] if s["step"] == CLEAN_STEPS) for x in per]
        rep.check(
            f"{p}: the sticky fault was injected on rank {FAULTY_RANK}",
            faulty[FAULTY_RANK]["injected"] > 0,
            f"{faulty[FAULTY_RANK]['injected']} elements changed",
        )
        rep.check(f"{p}: no rank commits the faulty step", not any(s["commit"] for s in faulty))
        named = [i for s in faulty for i in s["incidents"] if i["step"] == CLEAN_STEPS]
        good = [
            i for i in named if i["suspect_ranks"] == [FAULTY_RANK] and str(i["device"] or "").startswith(device_prefix)
        ]
        rep.check(
            f"{p}: the incident names rank {FAULTY_RANK} alone and its device",
            bool(named) and len(good) == len(named),
            f"{named[0]['kind']} suspects {named[0]['suspect_ranks']} on "
            f"{named[0]['device']}, sticky={named[0]['sticky']}"
            if named
            else "no incident at that step",
        )
        rep.check(
            f"{p}: the gradient's path into DDP's all-reduce is checked on every step",
            all("reduction" in s.get("checks", ()) for x in per for s in x["steps"]),
        )
        path = [next(s for s in x["steps"] if s["step"] == PATH_STEP) for x in per]
        seen = [[(i["kind"], i["suspect_ranks"]) for i in s["incidents"]] for s in path]
        rep.check(
            f"{p}: a gradient changed after the guard's hook on rank {FAULTY_RANK} is vetoed and names it alone",
            not any(s["commit"] for s in path) and all(x == [("reduction", [FAULTY_RANK])] for x in seen),
            f"incidents at step {PATH_STEP}: {seen[0]}",
        )
        step_s = sorted(s["seconds"] for x in per for s in x["steps"])
        rep.measure(
            p,
            {
                "calibration": per[0]["calibration"]["text"],
                "incident": named[0] if named else None,
                "median_step_s": step_s[len(step_s) // 2],
            },
        )


def run(ctx: Context, rep: SectionReport) -> str | None:
    import torch
    import torch.distributed as dist

    rep.check(
        "torch.distributed has gloo", dist.is_available() and dist.is_gloo_available(), f"torch {torch.__version__}"
    )
    ctx.require_gpu(
        f"run {WORLD} ranks over gloo on cuda:0 (fp32 and bf16 autocast): calibrate, "
        f"{CLEAN_STEPS} clean steps, a sticky fault on rank {FAULTY_RANK}"
    )
    if not rep.check("torch sees CUDA", torch.cuda.is_available(), f"CUDA {torch.version.cuda}"):
        return None
    try:
        ranks = run_job(device="cuda", timeout=ctx.left())
    except RankFailed as e:
        rep.check("the 3-rank job finishes", False, str(e).splitlines()[0])
        rep.say(str(e))
        return None
    evaluate(rep, ranks, device="cuda:0", device_prefix="GPU-")
    return (
        f"{WORLD} ranks on one GPU: calibrated, clean steps silent, the sticky fault on rank {FAULTY_RANK} "
        f"vetoed and named, in {' and '.join(PRECISIONS)}"
    )
