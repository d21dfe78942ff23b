"""Throughput of each golden family on this CPU (numpy backend, one pinned core) next to the plain numpy
equivalent measured in the same run.

GEMM: FLOP/s of the suite's GEMM cases against ``np.matmul`` on the same operands (fp16/bf16 widened to fp32 the
way the backend does it, since numpy has no 16-bit BLAS). Memory: bytes of the buffer under test read plus written
by the march and the final golden compare, per second, against ``np.copyto`` of a buffer of the same size (bytes
read plus written). Goals: GEMM >= 0.8x, memory >= 0.5x.

Each case and its plain equivalent run alternately, many times, and each side keeps its fastest run: on a shared
machine the least disturbed run is the fairest figure, and alternating makes both sides see the same load. A
family's rate is its total work over the sum of its cases' fastest times.

Usage: ``python benchmarks/suite_cpu.py [--core N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from sdcguard.golden import NumpyBackend  # noqa: E402
from sdcguard.golden.bits import e4m3_table  # noqa: E402
from sdcguard.golden.cases import Case  # noqa: E402
from sdcguard.golden.cpu_kernels import flops, traffic_bytes  # noqa: E402


def fastest_pair(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Fastest time of ``a`` and of ``b``, run alternately ``repeats`` times each (after one warm-up)."""
    a()
    b()
    best_a = best_b = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        best_a, best_b = min(best_a, t1 - t0), min(best_b, t2 - t1)
    return best_a, best_b


def widen(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        return x.astype(np.float32)
    if dtype == "bf16":
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype == "fp8":
        return np.take(e4m3_table(), x)
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--core", type=int, default=min(os.sched_getaffinity(0)))
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    with NumpyBackend(args.core) as backend:
        cases = backend.cases()
        by_family: dict[str, list[Case]] = {}
        for c in cases:
            by_family.setdefault(c.family, []).append(c)

        def suite_run(case: Case) -> Callable[[], object]:
            def go() -> object:
                r = backend.run(case)
                assert r.passed, r
                return r

            return go

        print(
            f"golden suite on {backend.device} (numpy backend, BLAS single-threaded: {backend.blas_pinned}), "
            f"fastest of {args.repeats} alternating runs per case"
        )
        print(f"{'family':8} {'cases':>5} {'suite':>14} {'plain numpy':>14} {'ratio':>6}  goal")

        t_suite = t_plain = 0.0
        for c in by_family["gemm"]:
            inp = backend.suite.inputs(c)
            out = np.empty(c.shape, dtype=c.out_dtype)

            def plain(
                a: np.ndarray = inp["a"], b: np.ndarray = inp["b"], d: str = c.dtype, o: np.ndarray = out
            ) -> None:
                np.matmul(widen(a, d), widen(b, d), out=o)

            ts, tp = fastest_pair(suite_run(c), plain, args.repeats)
            t_suite, t_plain = t_suite + ts, t_plain + tp
        work = float(sum(flops(c) for c in by_family["gemm"]))
        print(
            f"{'gemm':8} {len(by_family['gemm']):>5} {work / t_suite / 1e9:>9.2f} GF/s "
            f"{work / t_plain / 1e9:>9.2f} GF/s {t_plain / t_suite:>6.2f}  >= 0.8"
        )

        t_suite = t_plain = 0.0
        work = copy_work = 0.0
        for c in by_family["memory"]:
            src = np.random.default_rng(0).integers(0, 2**32, c.size, dtype=np.uint32)
            dst = np.empty_like(src)
            ts, tp = fastest_pair(suite_run(c), lambda s=src, d=dst: np.copyto(d, s), args.repeats)
            t_suite, t_plain = t_suite + ts, t_plain + tp
            work += traffic_bytes(c)
            copy_work += 2 * c.nbytes
        print(
            f"{'memory':8} {len(by_family['memory']):>5} {work / t_suite / 1e9:>9.2f} GB/s "
            f"{copy_work / t_plain / 1e9:>9.2f} GB/s {(work / t_suite) / (copy_work / t_plain):>6.2f}  >= 0.5"
        )

        for fam in ("alu", "ieee", "shared"):
            cs = by_family[fam]
            total = 0.0
            for c in cs:
                ts, _ = fastest_pair(suite_run(c), lambda: None, args.repeats // 2)
                total += ts
            elems = float(sum(c.params.get("n", c.size) for c in cs))
            print(f"{fam:8} {len(cs):>5} {elems / total / 1e6:>9.1f} Me/s {'-':>14} {'-':>6}  (input elements/s)")


if __name__ == "__main__":
    main()
