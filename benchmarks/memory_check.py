"""Per-step cost of the guard's own-rank checks: the memory check (this rank's parameter shards fingerprinted after
the optimizer step and again at the next step's check) and the non-finite check (``isfinite`` over the gradients),
as a share of a training step, one process on CPU.

    python benchmarks/memory_check.py [--d 256] [--layers 6] [--batch 8] [--seq 256] [--rounds 20] [--threads 1]

A ~10M-parameter transformer language model trains with AdamW. Each round times, back to back so machine load hits
all alike, one training step (forward, backward, optimizer), the memory check's two reads
(:meth:`~sdcguard.training.local.memory.MemoryCheck.settle` then ``columns``) and the non-finite check's read
(``NonFiniteCheck.columns``). Prints the medians and each check's share of the step: the figure ``docs/guard.md``
quotes, as a ratio measured in one run (never an assertion on seconds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.replica_overhead import _model  # noqa: E402


def measure(cfg: dict[str, int]) -> dict[str, Any]:
    """Median seconds of a step, of the memory check and of the non-finite check, over ``cfg["rounds"]`` rounds."""
    import torch
    import torch.nn.functional as F

    from sdcguard.training.local.finite import NonFiniteCheck
    from sdcguard.training.local.memory import MemoryCheck
    from sdcguard.training.step_check import StepState

    torch.set_num_threads(cfg["threads"])
    model = _model(cfg["vocab"], cfg["d"], cfg["layers"], cfg["seq"])
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = [(0, None, "host")]
    device = torch.device("cpu")
    memory = MemoryCheck(lambda: [p.detach() for p in params], names, ids, None, device, index=0)
    finite = NonFiniteCheck(lambda: [p.grad for p in params], ids, None, device)
    state = StepState(step=1, sample=0, sampled=False, observed=None)
    gen = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"step": [], "memory": [], "nonfinite": []}
    for r in range(cfg["rounds"] + 2):
        tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=gen)
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
        t1 = time.perf_counter()
        memory.settle()
        row = memory.columns(state).tolist()  # the host read the step's gather makes
        t2 = time.perf_counter()
        bad = finite.columns(state).tolist()
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        assert row[1] == 0 and bad == [0, 0], (row, bad)
        if r >= 2:  # two warm-up rounds
            times["step"].append(t1 - t0)
            times["memory"].append(t2 - t1)
            times["nonfinite"].append(t3 - t2)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"params": sum(p.numel() for p in params), **med}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    cfg = vars(ap.parse_args(argv))
    out = measure(cfg)
    step = out["step"]
    print(
        f"model: {out['params'] / 1e6:.1f}M parameters (fp32), batch {cfg['batch']} x seq {cfg['seq']}, "
        f"{cfg['threads']} threads, median of {cfg['rounds']} rounds"
    )
    print(f"training step (forward, backward, AdamW): {step * 1e3:.1f} ms")
    for name, what in (("memory", "memory check (two reads of the shards)"), ("nonfinite", "non-finite check")):
        print(f"{what}: {out[name] * 1e3:.2f} ms = {out[name] / step:.2%} of a step")
    print(f"both: {(out['memory'] + out['nonfinite']) / step:.2%} of a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
