"""What fault injection costs a training step, as ratios measured side by side in one run.

    python benchmarks/inject_overhead.py [--steps N]

Rows: a small MLP's forward + backward on CPU, (a) without a mode, (b) under an OpFaultMode that matches no rank
(the cost of dispatching every aten op through Python), (c) with a sticky one-element matmul fault (a full
corruption on every matmul), (d) a sticky control fault on every matmul. Also the numpy fire-drill hook's cost
per golden output. Printed as ratios to (a); never asserted in tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from sdcguard.devices import sim_id  # noqa: E402
from sdcguard.inject import Fault, golden_output_hook, parse_inject_spec  # noqa: E402
from sdcguard.inject.torch_faults import OpFaultMode  # noqa: E402


def _step_time(model: torch.nn.Module, x: torch.Tensor, mode: OpFaultMode | None, steps: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for s in range(steps):
            if mode is not None:
                mode.step = s
                with mode:
                    model(x).sum().backward()
            else:
                model(x).sum().backward()
        best = min(best, (time.perf_counter() - t0) / steps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(4)])
    x = torch.randn(64, 256)
    rows = {
        "no mode": None,
        "mode, other rank": OpFaultMode(Fault(pattern="bitflip"), ops="matmul", rank=1),
        "sticky bitflip, every matmul": OpFaultMode(Fault(pattern="bitflip"), ops="matmul"),
        "sticky control fault, every matmul": OpFaultMode(Fault(pattern="zero", control=1.0), ops="matmul"),
    }
    times = {name: _step_time(model, x, mode, args.steps) for name, mode in rows.items()}
    base = times["no mode"]
    print("| training step (4x Linear(256)+GELU, batch 64, CPU) | ratio to no mode |\n|---|---|")
    for name, t in times.items():
        print(f"| {name} | {t / base:.2f} |")

    out = np.random.default_rng(0).standard_normal(1 << 16)
    hook = golden_output_hook(parse_inject_spec("sim:0:mix,rate=1.0"), sim_id(0))
    assert hook is not None
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        out.copy()
    copy_t = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        hook("case", out)
    hook_t = (time.perf_counter() - t0) / n
    print(f"\nfire-drill hook on a 64k-element float64 output: {hook_t / copy_t:.1f}x the cost of copying it")


if __name__ == "__main__":
    main()
