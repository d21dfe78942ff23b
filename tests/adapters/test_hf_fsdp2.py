"""The Hugging Face callback on an FSDP2 model, on the CPU: the adapter's FSDP2 path through a real ``Trainer``.

Accelerate's FSDP2 plugin falls back to DDP on the CPU, so the model is sharded by hand (``fully_shard`` per GPT-2
block, then the root, over the harness's gloo group of 3 processes) and handed to the ``Trainer`` the way
``from_pretrained(distributed_config=...)`` hands it a model it sharded at load time: the ``Trainer`` then leaves
placement and gradient reduction to the model (no DDP around it) and defers the reduction of every micro-batch but
the last with ``set_requires_gradient_sync(False)``, as Accelerate's FSDP2 ``no_sync`` does. Marking the model so is
the one seam: transformers keeps the flag in ``_is_distributed_loading_by_transformers``.

What a user relies on: the guard the callback builds watches FSDP2 (not DDP), every step's sample is judged (the
accumulated micro-batch included), clean steps commit and train with no incident, and a one-off fault in the
``Trainer``'s own forward of an accumulated micro-batch on one rank is named at its step and applied by no rank.
The GPU check (``hf-fsdp2``) runs the same callback with Accelerate's real FSDP2 plugin.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch

from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode
from sdcguard.testing import run_ranks
from sdcguard.testing.models import make_batch

pytestmark = pytest.mark.distributed
STEPS = 4
FAULT_STEP, FAULT_RANK = 2, 1
"""Step 2 samples micro-batch 0 of 2 (the sample number rotates it), whose reduction the ``Trainer`` defers."""


def _hf_fsdp2(rank: int, world: int, out_dir: str) -> dict[str, Any]:
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers.distributed import DistributedConfig

    from sdcguard.adapters.hf import SDCGuardTrainerCallback
    from sdcguard.testing.hf import hf_step_probe

    warnings.filterwarnings("ignore")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    config = transformers.GPT2Config(
        vocab_size=61, n_positions=16, n_embd=16, n_layer=2, n_head=2, activation_function="gelu",
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.config.distributed_config = DistributedConfig(fsdp_size=world)
    model._is_distributed_loading_by_transformers = True  # sharded before the Trainer: it must not wrap it in DDP
    rows = [
        {"input_ids": make_batch(s, rank)["tokens"][0], "labels": make_batch(s, rank)["tokens"][0]} for s in range(24)
    ]
    mode = OpFaultMode(
        Fault(pattern="bitflip", bit="exponent", timing="transient", seed=1),
        ops="gelu", phase="forward", rank=FAULT_RANK, steps=[FAULT_STEP],
    )  # fmt: skip

    cb = SDCGuardTrainerCallback(replay_every=1, weight_check_every=1, escalate="off")
    probe = hf_step_probe(cb, mode)
    args = transformers.TrainingArguments(
        output_dir=out_dir, max_steps=STEPS, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb, probe])
    with mode:
        trainer.train()
    assert cb.guard is not None
    return {
        "steps": probe.steps,
        "changed": len(mode.records),
        "samples": cb.guard.state_dict()["samples"],
        "taps": type(cb.guard.taps).__name__,
        "wrapped": type(trainer.model_wrapped).__name__,
        "verified": cb.guard.last_verified_step,
    }


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_hf_trainer_on_a_hand_sharded_fsdp2_model_names_a_fault_in_an_accumulated_micro_batch(tmp_path: Any) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate (the Trainer needs it) is not installed")
    results = run_ranks(_hf_fsdp2, 3, str(tmp_path), timeout=180)
    assert results[FAULT_RANK]["changed"] >= 1, "the injector changed nothing"
    for res in results:
        assert res["taps"] == "FSDPTaps" and res["wrapped"] != "DistributedDataParallel"
        assert res["samples"] == STEPS  # every step sampled and replayed
        for step, commit, changed, incidents in res["steps"]:
            if step == FAULT_STEP:
                assert incidents == [("replay", (FAULT_RANK,))] and not commit and not changed  # not applied
            else:
                assert incidents == [] and commit and changed, (step, incidents)
        assert res["verified"] == FAULT_STEP - 1  # the clean samples before the fault were judged and verified
    assert results[0]["steps"] == results[1]["steps"] == results[2]["steps"]
