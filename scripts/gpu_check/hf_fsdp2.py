"""Section ``hf-fsdp2``: the Hugging Face callback on a ``Trainer`` that shards with Accelerate's real FSDP2 plugin.

On the CPU Accelerate's FSDP2 plugin falls back to DDP, so this is the first place the plugin's path runs under the
callback. One NCCL rank on ``cuda:0`` (NCCL refuses two ranks on one device): ``TrainingArguments(fsdp="full_shard",
fsdp_config={"version": 2, ...})`` shards a small GPT-2 per block, and with ``gradient_accumulation_steps=2``
Accelerate's FSDP2 ``no_sync`` turns gradient sync off for the first micro-batch of each step, so half the samples
are accumulated micro-batches; a shard group of one rank reduces without a reduce-scatter besides. The callback
(``replay_every=1``, ``escalate="off"``) must:

- build its guard on FSDP2 hooks, the model not wrapped in DDP;
- sample every step, clean steps commit and train with no incident;
- veto a one-off fault in the ``Trainer``'s own forward of step ``FAULT_STEP`` (an accumulated micro-batch) and name
  rank 0 (one device: its two reruns agree against the original), the weights untouched at that step.

``run_job(device="cpu")`` runs the same callback on the CPU (the tests do), with the model sharded by hand over one
gloo rank and handed to the ``Trainer`` as transformers hands it a model sharded at load time, since the plugin is
not there to shard it.
"""

from __future__ import annotations

import os
from typing import Any

from sdcguard.testing import RankFailed, run_ranks

from .context import Context
from .results import SectionReport

__all__ = ["run", "run_job", "evaluate", "STEPS", "FAULT_STEP"]

STEPS = 4
FAULT_STEP = 2
"""Step 2 samples micro-batch 0 of 2 (the sample number rotates it): the one whose reduction is deferred."""


def _model(transformers: Any, device_type: str) -> Any:
    import torch

    config = transformers.GPT2Config(
        vocab_size=61,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        activation_function="gelu",
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    if device_type == "cpu":  # no plugin here: shard by hand, as from_pretrained(distributed_config=...) does
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers.distributed import DistributedConfig

        mesh = init_device_mesh("cpu", (1,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.config.distributed_config = DistributedConfig(fsdp_size=1)
        model._is_distributed_loading_by_transformers = True
    return model


def _rank_job(rank: int, world: int, device_type: str, out_dir: str) -> dict[str, Any]:
    import warnings

    import torch
    import transformers

    from sdcguard.adapters.hf import SDCGuardTrainerCallback
    from sdcguard.inject import Fault
    from sdcguard.inject.torch_faults import OpFaultMode
    from sdcguard.testing.hf import hf_step_probe

    warnings.filterwarnings("ignore")
    torch.use_deterministic_algorithms(True)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    model = _model(transformers, device_type)
    g = torch.Generator().manual_seed(rank)
    rows = [{"input_ids": t, "labels": t} for t in torch.randint(0, 61, (4 * STEPS, 12), generator=g)]
    mode = OpFaultMode(
        Fault(pattern="bitflip", bit="exponent", timing="transient", seed=1),
        ops="gelu",
        phase="forward",
        rank=0,
        steps=[FAULT_STEP],
    )

    cb = SDCGuardTrainerCallback(replay_every=1, weight_check_every=1, escalate="off")
    probe = hf_step_probe(cb, mode)
    plugin = {"fsdp": "full_shard", "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]}}
    args = transformers.TrainingArguments(
        output_dir=out_dir,
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        use_cpu=device_type == "cpu",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **(plugin if device_type == "cuda" else {}),
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb, probe])
    with mode:
        trainer.train()
    assert cb.guard is not None
    return {
        "steps": [
            {
                "step": st,
                "commit": bool(ok),
                "changed": changed,
                "incidents": [{"kind": k, "suspect_ranks": list(r)} for k, r in found],
            }
            for st, ok, changed, found in probe.steps
        ],
        "injected": len(mode.records),
        "samples": int(cb.guard.state_dict()["samples"]),
        "taps": type(cb.guard.taps).__name__,
        "wrapped": type(trainer.model_wrapped).__name__,
        "plugin": bool(getattr(trainer.accelerator, "is_fsdp2", False)),
        "device": str(cb.guard.device),
    }


def run_job(*, device: str, timeout: float, out_dir: str) -> dict[str, Any]:
    """The one rank's findings on ``device`` (``cuda``: NCCL and the plugin; ``cpu``: gloo, sharded by hand)."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    comm = "nccl" if device == "cuda" else "gloo"
    (found,) = run_ranks(_rank_job, 1, device, out_dir, timeout=timeout, backend=comm)
    return dict(found)


def evaluate(rep: SectionReport, found: dict[str, Any], *, plugin: bool) -> None:
    """The checks of the module docstring (``plugin``: Accelerate's FSDP2 plugin must have sharded the model)."""
    if plugin:
        rep.check("the Trainer sharded with Accelerate's FSDP2 plugin", found["plugin"])
    rep.check(
        "the callback's guard watches FSDP2 (not DDP)",
        found["taps"] == "FSDPTaps" and found["wrapped"] != "DistributedDataParallel",
        f"{found['taps']}, model {found['wrapped']} on {found['device']}",
    )
    rep.check(f"all {STEPS} steps sampled and replayed", found["samples"] == STEPS == len(found["steps"]))
    clean = [s for s in found["steps"] if s["step"] != FAULT_STEP]
    noisy = [s for s in clean if not (s["commit"] and s["changed"]) or s["incidents"]]
    rep.check("clean steps commit and train with no incident", bool(clean) and not noisy, str(noisy[:1]))
    rep.check("the fault was injected in the Trainer's forward", found["injected"] > 0)
    at = [s for s in found["steps"] if s["step"] == FAULT_STEP]
    rep.check(
        "the faulty step is vetoed and changes no weight", bool(at) and not at[0]["commit"] and not at[0]["changed"]
    )
    named = at[0]["incidents"] if at else []
    rep.check("its incident names rank 0", named == [{"kind": "replay", "suspect_ranks": [0]}], str(named))
    rep.measure("steps", found["steps"])


def run(ctx: Context, rep: SectionReport) -> str | None:
    import importlib.util

    have = {name: importlib.util.find_spec(name) is not None for name in ("transformers", "accelerate")}
    rep.check("transformers and accelerate are installed", all(have.values()), str(have))
    ctx.require_gpu(
        f"train a GPT-2 with the Trainer and Accelerate's FSDP2 plugin on cuda:0 under the callback ({STEPS} steps "
        "of 2 micro-batches, sync deferred on the first), a fault in an accumulated micro-batch named"
    )
    if not all(have.values()):
        return None
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-hf-") as out_dir:
            found = run_job(device="cuda", timeout=ctx.left(), out_dir=out_dir)
    except RankFailed as e:
        rep.check("the Trainer job finishes", False, str(e).splitlines()[0])
        rep.say(str(e))
        return None
    evaluate(rep, found, plugin=True)
    return "the HF callback on Accelerate's FSDP2 plugin: accumulated samples judged, the fault vetoed and named"
