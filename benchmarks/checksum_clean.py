"""False alarms of the matmul checksum checks on clean training: steps of real models through every entry point the
tests use, every matmul checked on every step (``checksum_every=1``), and how many matmuls that is per step.

Runs (one process each, CPU): a transformers GPT-2 loop through ``guard.step`` in fp32 and under bf16 autocast
(eager attention, so the attention matmuls are ``bmm`` and checked), the same GPT-2 through the Hugging Face
``Trainer`` callback, and the tiny transformer through the Lightning callback at ``bf16-mixed``. The weights train
(AdamW), so the magnitudes the bound sees move as they would. Run::

    python benchmarks/checksum_clean.py [--steps 10000] [--json FILE]

``--steps`` is the total, split over the runs. Exit status 1 when any clean step alarmed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

SHARES = {"gpt2 loop fp32": 0.3, "gpt2 loop bf16 autocast": 0.3, "lightning bf16-mixed": 0.2, "hf trainer": 0.2}


def _gpt2(n_layer: int = 2) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=61, n_positions=32, n_embd=32, n_layer=n_layer, n_head=4, attn_implementation="eager"
    )
    return transformers.GPT2LMHeadModel(config)


def _tally(out: dict[str, Any], report: Any) -> None:
    out["steps"] += 1
    out["alarms"] += int(bool(report.incidents) or not report.commit)
    out["checked"] += report.matmuls_checked
    out["unverifiable"] = out.get("unverifiable", 0) + report.matmuls_unverifiable
    out["run"] += report.matmuls_run


def _loop(steps: int, bf16: bool) -> dict[str, Any]:
    import torch

    from sdcguard import SDCGuard
    from sdcguard.testing.models import make_batch

    model = _gpt2()

    def loss_fn(m: Any, b: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return m(input_ids=b["tokens"], labels=b["tokens"]).loss

    guard = SDCGuard(model, loss_fn, replay_every=0, checksum_every=1, escalate="off")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = {"steps": 0, "alarms": 0, "checked": 0, "run": 0}
    for step in range(steps):
        _tally(out, guard.step(step, make_batch(step, 0, batch=8, seq=32)))
        opt.step()
        opt.zero_grad()
    return out


def _lightning(steps: int) -> dict[str, Any]:
    import lightning.pytorch as L
    import torch

    from sdcguard.adapters.lightning import SDCGuardCallback
    from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch

    out = {"steps": 0, "alarms": 0, "checked": 0, "run": 0}

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = TinyTransformer(d=32, heads=4, layers=2, seq=16, p=0.1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return lm_loss(self.net, batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    class Probe(L.Callback):
        def on_train_batch_end(self, *a: Any) -> None:
            _tally(out, cb.last_report)

    cb = SDCGuardCallback(replay_every=0, checksum_every=1, escalate="off")
    data = [make_batch(s, 0, batch=8, seq=16) for s in range(steps)]
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        precision="bf16-mixed",
        logger=False,
        callbacks=[cb, Probe()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))
    return out


def _hf(steps: int, out_dir: str) -> dict[str, Any]:
    import transformers

    from sdcguard.adapters.hf import SDCGuardTrainerCallback
    from sdcguard.testing.models import make_batch

    out = {"steps": 0, "alarms": 0, "checked": 0, "run": 0}
    cb = SDCGuardTrainerCallback(replay_every=0, checksum_every=1, escalate="off")

    class Probe(transformers.TrainerCallback):
        def on_optimizer_step(self, *a: Any, **k: Any) -> None:
            _tally(out, cb.last_report)

    rows = [{"input_ids": t, "labels": t} for s in range(steps) for t in make_batch(s, 0, batch=4, seq=32)["tokens"]]
    args = transformers.TrainingArguments(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    transformers.Trainer(model=_gpt2(), args=args, train_dataset=rows, callbacks=[cb, Probe()]).train()
    return out


def main() -> None:
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    results = {}
    for name, share in SHARES.items():
        n = max(1, int(args.steps * share))
        t0 = time.monotonic()
        if name.startswith("gpt2"):
            r = _loop(n, bf16="bf16" in name)
        elif name.startswith("lightning"):
            r = _lightning(n)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                r = _hf(n, tmp)
        r["seconds"] = round(time.monotonic() - t0, 1)
        results[name] = r
        print(
            f"{name:<26} {r['steps']:>6} clean steps, {r['alarms']} false alarms, "
            f"{r['checked'] / max(1, r['steps']):.0f} of {r['run'] / max(1, r['steps']):.0f} matmuls checked per "
            f"step ({r.get('unverifiable', 0) / max(1, r['steps']):.0f} unverifiable), {r['seconds']} s",
            flush=True,
        )
    total = sum(r["steps"] for r in results.values())
    alarms = sum(r["alarms"] for r in results.values())
    print(
        f"total: {total} clean steps, {alarms} false alarms, "
        f"{sum(r['checked'] for r in results.values()):,} matmuls checked, "
        f"{sum(r.get('unverifiable', 0) for r in results.values()):,} unverifiable"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(1 if alarms else 0)


if __name__ == "__main__":
    main()
