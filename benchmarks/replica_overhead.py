"""Step-time overhead of the cross-replica checks on a small DDP transformer job (3 ranks, gloo, CPU).

    python benchmarks/replica_overhead.py [--ranks 3] [--blocks 6] [--steps-per-block 3] [--batch 8] [--seq 256]

A ~10M-parameter transformer language model trains with DDP; blocks of steps alternate between "checked"
(``ReplicaCheck.check_gradients`` every step, ``check_weights`` every 10th step) and "unchecked", interleaved in
one run so machine load drifts hit both alike. Prints the mean step time of each, the overhead in percent (goal:
at most 1%), and the time spent inside the checks themselves as a share of an unchecked step (the same figure
without the noise of comparing two sets of noisy steps), plus the forward+backward and optimizer phases of each
arm. ``--control`` runs the same schedule with no checks in either arm (an A/A run: the noise floor and any
schedule bias); ``--unchecked-first`` swaps which arm starts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _model(vocab: int, d: int, layers: int, seq: int) -> Any:
    import torch

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, d)
            self.pos = torch.nn.Parameter(torch.zeros(seq, d))
            layer = torch.nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, batch_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(d, vocab)

        def forward(self, tokens: Any) -> Any:
            mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
            return self.head(self.blocks(self.embed(tokens) + self.pos[: tokens.shape[1]], mask=mask, is_causal=True))

    torch.manual_seed(0)
    return TinyLM()


def _rank(rank: int, world_size: int, cfg: dict[str, int]) -> Any:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sdcguard import ReplicaCheck

    model = _model(cfg["vocab"], cfg["d"], cfg["layers"], cfg["seq"])
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    check = ReplicaCheck(ddp)
    gen = torch.Generator().manual_seed(rank)
    # (checked, step s, s inside the checks, s forward+backward, s optimizer step)
    records: list[tuple[bool, float, float, float, float]] = []
    total = cfg["warmup"] + cfg["blocks"] * cfg["steps_per_block"]
    incidents = 0
    for step in range(total):
        block = (step - cfg["warmup"]) // cfg["steps_per_block"]
        checked = step >= cfg["warmup"] and block % 2 == cfg["checked_parity"]
        run_checks = checked and not cfg["control"]
        tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen)
        dist.barrier()  # start every step together, so a step's time is its own
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = ddp(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), tokens[:, 1:].reshape(-1))
        loss.backward()
        t_backward = time.perf_counter()
        in_check = 0.0
        if run_checks:
            c0 = time.perf_counter()
            incidents += len(check.check_gradients(step))
            in_check += time.perf_counter() - c0
        o0 = time.perf_counter()
        opt.step()
        t_opt = time.perf_counter() - o0
        if run_checks and step % 10 == 0:
            c0 = time.perf_counter()
            incidents += len(check.check_weights(step))
            in_check += time.perf_counter() - c0
        records.append((checked, time.perf_counter() - t0, in_check, t_backward - t0, t_opt))
    return nparams, records[cfg["warmup"] :], incidents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=6, help="alternating blocks (checked first), even number")
    ap.add_argument("--steps-per-block", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--unchecked-first", action="store_true", help="start with an unchecked block")
    ap.add_argument("--control", action="store_true", help="A/A control: no checks in either arm (noise floor)")
    args = ap.parse_args()
    cfg = {k: getattr(args, k) for k in ("blocks", "steps_per_block", "warmup", "batch", "seq", "d", "layers", "vocab")}
    cfg["checked_parity"] = 1 if args.unchecked_first else 0
    cfg["control"] = args.control

    from sdcguard.testing import run_ranks

    out = run_ranks(_rank, args.ranks, cfg, timeout=args.timeout)
    nparams = out[0][0]
    # A step takes as long as its slowest rank.
    steps = [(recs[0][0], max(r[1] for r in recs), max(r[2] for r in recs)) for recs in zip(*(o[1] for o in out))]
    on = [s for c, s, _ in steps if c]
    off = [s for c, s, _ in steps if not c]
    in_check = [k for c, _, k in steps if c]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if args.control:
        print("A/A CONTROL RUN: no checks run in either arm; any 'overhead' below is noise or schedule bias")
    print(
        f"{args.ranks} ranks (gloo, CPU), {nparams / 1e6:.1f}M parameters, {args.batch * args.seq} tokens per rank per "
        f"step, {len(on)} checked + {len(off)} unchecked steps interleaved in blocks of {args.steps_per_block}; "
        f"load average {load:.1f} on {os.cpu_count()} CPUs (shared machine: step times are noisy)"
    )
    print(f"  unchecked step: mean {statistics.mean(off):.3f} s, median {statistics.median(off):.3f} s")
    print(f"  checked step  : mean {statistics.mean(on):.3f} s, median {statistics.median(on):.3f} s")
    overhead = 100 * (statistics.median(on) / statistics.median(off) - 1)
    print(f"  overhead (median step time, checked vs unchecked): {overhead:+.2f}%")
    # Paired: each checked block against the unchecked block right after it (drift in machine load cancels).
    per = args.steps_per_block
    first, second = (1, 0) if args.unchecked_first else (0, 1)
    pairs = [
        statistics.mean(s for _, s, _ in steps[(b + first) * per : (b + first + 1) * per])
        / statistics.mean(s for _, s, _ in steps[(b + second) * per : (b + second + 1) * per])
        - 1
        for b in range(0, args.blocks - 1, 2)
    ]
    print(f"  overhead (median of {len(pairs)} paired blocks): {100 * statistics.median(pairs):+.2f}%")
    print(
        f"  time inside the checks: mean {1000 * statistics.mean(in_check):.1f} ms per checked step = "
        f"{100 * statistics.mean(in_check) / statistics.median(off):.2f}% of an unchecked step   (goal <= 1%)"
    )
    phases = {c: [r for o in out for r in o[1] if r[0] == c] for c in (True, False)}
    for c, name in ((False, "unchecked"), (True, "checked")):
        fb = statistics.mean(r[3] for r in phases[c])
        op = statistics.mean(r[4] for r in phases[c])
        print(f"  {name:9s} phases (mean over ranks and steps): forward+backward {fb:.3f} s, optimizer {op:.3f} s")
    print(f"  incidents raised: {sum(o[2] for o in out)} (expected 0)")


if __name__ == "__main__":
    main()
