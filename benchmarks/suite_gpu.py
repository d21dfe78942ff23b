"""Every golden family on every visible GPU against the goldens, with each family's throughput next to the
device's own reference measured in the same run (``scripts/gpu_check.sh`` runs this).

GEMM: TFLOP/s of the suite's GEMM cases (cuBLAS and our tensor-core kernel, per dtype) against ``cupy.matmul`` on
random data of the same shape and dtype, and against ``cupy.matmul`` at 8192^3 (the device's practical peak).
Memory: GB/s of the march (bytes of the buffer read plus written by every launch) against a device-to-device copy
of a buffer of the same size. Times are CUDA-event times of the launches alone, fastest of ``--repeats``.
Intrinsics (per-architecture results): the outputs of every GPU are compared with each other; with
``--record-intrinsics`` the result is recorded as the architecture's golden when at least two GPUs agree bit for
bit (``sdcguard.golden.suite.record_arch_golden``; commit the updated ``golden_vectors/``).

Exit status: 0 when every case passed on every GPU, 1 when any failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from sdcguard.golden import CASES, CupyBackend, default_suite  # noqa: E402
from sdcguard.golden.bits import sha256_bytes  # noqa: E402
from sdcguard.golden.cases import Case  # noqa: E402
from sdcguard.golden.cpu_kernels import flops  # noqa: E402


def event_time(cp: Any, fn: Callable[[], object], repeats: int) -> float:
    """Fastest CUDA-event time of ``fn`` (seconds)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def march_bytes(backend: CupyBackend, case: Case) -> int:
    plan = backend._plan(case)
    total = 0
    for launch in plan.launches:
        n = plan.scratch["out"][1] * 4
        if launch.kernel == "mem_write_u32":
            total += n
        else:
            rewrite = launch.args[7][1]  # mem_check_u32(buf, n, kind, p, salt, offset, invert, rewrite, ...)
            total += n * (2 if rewrite else 1)
    return total


def launches_only(backend: CupyBackend, case: Case) -> Callable[[], None]:
    """The case's device work without the host copy (for event timing)."""
    if case.family == "gemm" and case.params["impl"] == "cublas":
        from cupy._core import _routines_linalg as linalg

        from sdcguard.golden.cupy_backend import _COMPUTE

        inputs = backend._device_inputs(case)
        dt = inputs["a"].dtype
        mode = getattr(linalg, _COMPUTE[case.dtype])

        def go() -> None:
            before = linalg.get_compute_type(dt)
            linalg.set_compute_type(dt, mode)
            try:
                backend._cp.matmul(inputs["a"], inputs["b"])
            finally:
                linalg.set_compute_type(dt, before)

        return go
    from sdcguard.golden.cupy_backend import _SCALARS
    from sdcguard.golden.loader import get_kernel

    plan = backend._plan(case)
    inputs = backend._device_inputs(case)
    raw, layout, _ = backend._scratch_for(case, plan)
    views = {n: raw[o : o + c * np.dtype(d).itemsize].view(d) for n, (o, d, c) in layout.items()}
    calls = []
    for launch in plan.launches:
        args = []
        for arg in launch.args:
            if arg[0] == "buf":
                buf = views[arg[1]] if arg[1] in views else inputs[arg[1]]
                args.append(buf[arg[2] :] if arg[2] else buf)
            else:
                args.append(_SCALARS[arg[0]](arg[1]))
        calls.append((get_kernel(plan.module, launch.kernel, backend.index), launch, tuple(args)))

    def go() -> None:
        raw.fill(0)
        for fn, launch, args in calls:
            fn(launch.grid, launch.block, args)

    return go


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--memory-share", type=float, default=0.25, help="share of free memory the marches cover")
    ap.add_argument("--record-intrinsics", action="store_true",
                    help="record per-architecture intrinsics goldens where >= 2 GPUs agree")
    args = ap.parse_args()
    import cupy as cp

    suite = default_suite()
    count = cp.cuda.runtime.getDeviceCount()
    print(f"{count} CUDA device(s); golden suite: {len(suite.cases)} cases")
    failed = 0
    intrinsic_outputs: dict[str, list[tuple[int, str, np.ndarray]]] = {}
    for index in range(count):
        with cp.cuda.Device(index):
            backend = CupyBackend(index, memory_share=args.memory_share)
            print(f"\n== cuda:{index} {backend.model} {backend.arch} {backend.sm_count} SMs {backend.device}")
            fam_rows: dict[str, list[tuple[Case, float]]] = {}
            for case in backend.cases():
                results = [backend.run(case) for _ in range(3)]
                bad = [r for r in results if not r.passed]
                failed += len(bad)
                status = "ok" if not bad else (f"FAIL x{len(bad)}: element {bad[0].element} expected "
                                               f"{bad[0].expected} actual {bad[0].actual} xor {bad[0].xor_mask} "
                                               f"at {bad[0].location}")
                t = event_time(cp, launches_only(backend, case), args.repeats)
                fam_rows.setdefault(case.family, []).append((case, t))
                print(f"  {case.id:32} {status:8} {t * 1e3:9.3f} ms")
            # intrinsics: compare across devices (their goldens are per architecture)
            icase = next(c for c in CASES if c.family == "intrinsics")
            from sdcguard.golden.inputs import make_inputs
            from sdcguard.golden.launch import plan_for
            from sdcguard.golden.loader import get_kernel

            inp = {k: cp.asarray(v) for k, v in make_inputs(icase).items()}
            plan = plan_for(icase, make_inputs(icase), sm_count=backend.sm_count)
            out = cp.zeros(5 * icase.params["n"], dtype=cp.float32)
            smids = cp.zeros(plan.scratch["smids"][1], dtype=cp.uint32)
            launch = plan.launches[0]
            get_kernel(plan.module, launch.kernel, index)(
                launch.grid, launch.block, (inp["x"], inp["y"], out, smids, np.int32(icase.params["n"])))
            host_out = out.get().reshape(icase.shape)
            intrinsic_outputs.setdefault(backend.arch, []).append((index, backend.device, host_out))

            print(f"  {'family':8} {'suite':>16} {'ref same shape':>16} {'ratio':>6} {'ref peak':>16}")
            gemm = fam_rows.get("gemm", [])
            by_dtype: dict[str, list[tuple[Case, float]]] = {}
            for case, t in gemm:
                by_dtype.setdefault(case.dtype, []).append((case, t))
            for dtype, rows in by_dtype.items():
                work = sum(flops(c) for c, _ in rows)
                t_suite = sum(t for _, t in rows)
                if dtype == "fp8":  # cupy has no fp8 dtype: no cupy.matmul reference
                    print(f"  gemm.{dtype:4} {work / t_suite / 1e12:>11.2f} TF/s {'-':>16} {'-':>6} {'-':>16}")
                    continue
                t_ref = 0.0
                rng = cp.random.default_rng(0)
                # the reference runs cuBLAS with the same compute type; bf16 (no cupy dtype) is compared with fp16
                dt = {"fp64": cp.float64, "fp16": cp.float16, "bf16": cp.float16}.get(dtype, cp.float32)
                ref = "fp16" if dtype == "bf16" else dtype

                def pinned(fn: Callable[[], object], dt: Any = dt, ref: str = ref) -> Callable[[], None]:
                    from cupy._core import _routines_linalg as linalg

                    from sdcguard.golden.cupy_backend import _COMPUTE

                    def go() -> None:
                        before = linalg.get_compute_type(dt)
                        linalg.set_compute_type(dt, getattr(linalg, _COMPUTE[ref]))
                        try:
                            fn()
                        finally:
                            linalg.set_compute_type(dt, before)

                    return go

                for c, _ in rows:
                    m, n, k = c.params["m"], c.params["n"], c.params["k"]
                    a = rng.standard_normal((m, k), dtype=cp.float32).astype(dt)
                    b = rng.standard_normal((k, n), dtype=cp.float32).astype(dt)
                    t_ref += event_time(cp, pinned(lambda a=a, b=b: cp.matmul(a, b)), args.repeats)
                big = 8192
                a = cp.ones((big, big), dtype=dt)
                t_big = event_time(cp, pinned(lambda a=a: cp.matmul(a, a)), 3)
                del a
                print(f"  gemm.{dtype:4} {work / t_suite / 1e12:>11.2f} TF/s {work / t_ref / 1e12:>11.2f} TF/s "
                      f"{t_ref / t_suite:>6.2f} {2 * big**3 / t_big / 1e12:>11.2f} TF/s")
            mem = fam_rows.get("memory", [])
            if mem:
                work = sum(march_bytes(backend, c) for c, _ in mem)
                t_suite = sum(t for _, t in mem)
                words = backend._plan(mem[0][0]).scratch["out"][1]
                backend.close()  # give the march buffers back before the reference copy takes its own
                cp.get_default_memory_pool().free_all_blocks()
                src = cp.zeros(min(words, 1 << 28), dtype=cp.uint32)  # up to 1 GiB: copy bandwidth saturates
                dst = cp.empty_like(src)
                t_copy = event_time(cp, lambda: cp.copyto(dst, src), args.repeats)
                ref = 2 * src.nbytes / t_copy
                print(f"  {'memory':9} {work / t_suite / 1e9:>11.1f} GB/s {ref / 1e9:>11.1f} GB/s "
                      f"{work / t_suite / ref:>6.2f}   ({words * 4 / 2**30:.2f} GiB marched)")
                del src, dst
            for fam in ("alu", "ieee", "shared"):
                rows = fam_rows.get(fam, [])
                if rows:
                    elems = sum(c.params.get("n", c.size) for c, _ in rows)
                    print(f"  {fam:9} {elems / sum(t for _, t in rows) / 1e9:>11.2f} Ge/s")
    print("\nintrinsics (per-architecture results; every GPU of one architecture must agree):")
    for arch, rows in intrinsic_outputs.items():
        digests = {sha256_bytes(o) for _, _, o in rows}
        verdict = "agree" if len(digests) == 1 else "DISAGREE"
        print(f"  {arch}: {len(rows)} GPU(s) {verdict}: "
              + ", ".join(f"cuda:{i}={sha256_bytes(o)[:12]}" for i, _, o in rows))
        failed += 0 if len(digests) == 1 else 1
        if args.record_intrinsics and len(digests) == 1 and len(rows) >= 2:
            from sdcguard.golden.suite import record_arch_golden

            icase = next(c for c in CASES if c.family == "intrinsics")
            path = record_arch_golden(None, icase, arch, [(dev, o) for _, dev, o in rows])
            print(f"  recorded {path}")
    print(f"\n{'all cases passed' if not failed else f'{failed} failing runs'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
