"""Fingerprint throughput against the plainest read reduction and Megatron-LM's sha1-on-host check.

    python benchmarks/fingerprint.py [--device cpu|cuda] [--mib 256] [--repeats 5]

Prints, for one float32 buffer, in one run with the three measurements interleaved: sdcguard.fingerprint GB/s,
``x.view(torch.int64).sum()`` GB/s, ``hashlib.sha1(x.cpu().float().numpy())`` GB/s, and the ratios (goals:
>= 0.5x the plain reduction, >= 10x sha1). With ``--device cuda`` it also measures the device's memory bandwidth
with a device-to-device copy and prints the fingerprint's share of it (goal: >= 70%). Best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sdcguard.fingerprints import fingerprint  # noqa: E402


def _best(fn: Callable[[], object], sync: Callable[[], None], times: list[float]) -> None:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    times.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n = args.mib * (1 << 20) // 4
    x = torch.randn(n, device=device)
    nbytes = x.numel() * x.element_size()
    y = torch.empty_like(x)
    cases: dict[str, Callable[[], object]] = {
        "fingerprint": lambda: fingerprint(x),
        "int64 sum": lambda: x.view(torch.int64).sum().item(),
        "sha1 (Megatron)": lambda: hashlib.sha1(x.cpu().float().numpy()).hexdigest(),
    }
    if device.type == "cuda":
        cases["device copy"] = lambda: y.copy_(x)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm-up: weight tables, allocator, kernels
        fn()
    for _ in range(args.repeats):
        for name, fn in cases.items():
            if name.startswith("sha1") and len(times[name]) >= 2:
                continue  # slow and stable: two runs are enough
            _best(fn, sync, times[name])
    gbs = {k: nbytes / min(v) / 1e9 for k, v in times.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"buffer: {args.mib} MiB float32 on {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"load average {load:.1f} on {os.cpu_count()} CPUs (shared machine: figures are noisy)"
    )
    for k in ("fingerprint", "int64 sum", "sha1 (Megatron)"):
        print(f"  {k:18s} {gbs[k]:8.2f} GB/s")
    print(f"  fingerprint / int64 sum : {gbs['fingerprint'] / gbs['int64 sum']:.2f}x   (goal >= 0.5x)")
    print(f"  fingerprint / sha1 path : {gbs['fingerprint'] / gbs['sha1 (Megatron)']:.1f}x   (goal >= 10x)")
    if device.type == "cuda":
        read_bw = 2 * gbs["device copy"]  # a copy reads and writes every byte
        print(f"  device copy traffic     : {read_bw:8.2f} GB/s (read + write)")
        print(f"  fingerprint / copy bandwidth: {100 * gbs['fingerprint'] / read_bw:.0f}%   (goal >= 70%)")
        print(f"  int64 sum / copy bandwidth  : {100 * gbs['int64 sum'] / read_bw:.0f}%")


if __name__ == "__main__":
    main()
