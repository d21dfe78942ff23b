"""Section ``golden-suite``: every golden family on every GPU against the goldens, with throughput next to the
device's own reference measured in the same run.

Each case runs ``RUNS`` times through :class:`~sdcguard.golden.CupyBackend` (bit-exact against its golden), then
its device work alone (``backend.device_work``: no zeroing, no copy to the host) is timed with CUDA events,
fastest of ``repeats``.

- GEMM, per dtype: TFLOP/s of the suite's cases (cuBLAS with the compute type pinned, and our tensor-core kernel)
  against ``cupy.matmul`` on random data of the same shapes and compute type, and against ``cupy.matmul`` at
  ``peak_n``^3 on random data (the device's practical peak). bf16 has no cupy dtype: its reference is fp16; fp8
  has none.
- Memory: GB/s of the marches (bytes each launch reads and writes) against a device-to-device copy (bytes read
  plus written) of a buffer of the same size, up to 1 GiB.
- ALU, IEEE, shared memory: elements per second (no reference).

``benchmarks/suite_gpu.py`` prints the same figures as a table, from a live run or a recorded results.json.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .context import Context
from .results import SectionReport

__all__ = [
    "run",
    "measure_gpu",
    "table_lines",
    "event_time",
    "march_bytes",
    "RUNS",
    "REPEATS",
    "MEMORY_SHARE",
    "PEAK_N",
]

RUNS = 3
"""Compared runs of every case on every GPU."""
REPEATS = 5
"""Timed runs of each case's device work (the fastest counts)."""
MEMORY_SHARE = 0.25
"""Share of the free device memory the marches cover."""
PEAK_N = 8192
"""Size of the square ``cupy.matmul`` that stands for the device's practical peak."""


def event_time(cp: Any, fn: Callable[[], object], repeats: int) -> float:
    """Fastest CUDA-event time of ``fn`` in seconds, after one warm-up call."""
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


def march_bytes(plan: Any) -> int:
    """Bytes a memory march's launches move: a write pass writes the buffer, a check pass reads it (and writes it
    again when it rewrites)."""
    words = plan.scratch["out"][1]
    total = 0
    for launch in plan.launches:
        if launch.kernel == "mem_write_u32":
            total += 4 * words
        else:  # mem_check_u32(buf, n, kind, p, salt, offset, invert, rewrite, ...)
            total += 4 * words * (2 if launch.args[7][1] else 1)
    return total


def _gemm_rows(cp: Any, rows: list[tuple[Any, float]], repeats: int, peak_n: int) -> dict[str, dict[str, Any]]:
    from sdcguard.golden.cpu_kernels import flops
    from sdcguard.golden.cupy_backend import pinned_compute_type

    by_dtype: dict[str, list[tuple[Any, float]]] = {}
    for case, t in rows:
        by_dtype.setdefault(case.dtype, []).append((case, t))
    out: dict[str, dict[str, Any]] = {}
    for dtype, group in by_dtype.items():
        work = sum(flops(c) for c, _ in group)
        t_suite = sum(t for _, t in group)
        row: dict[str, Any] = {"cases": [c.id for c, _ in group], "suite_tflops": work / t_suite / 1e12}
        if dtype == "fp8":  # no cupy dtype, so no cupy.matmul to compare with
            row["reference"] = "none (cupy has no fp8 dtype)"
            out[dtype] = row
            continue
        ref = "fp16" if dtype == "bf16" else dtype  # bf16: no cupy dtype either; fp16 runs on the same units
        dt = {"fp64": cp.float64, "fp16": cp.float16}.get(ref, cp.float32)
        rng = cp.random.default_rng(0)
        t_ref = 0.0
        for c, _ in group:
            m, n, k = c.params["m"], c.params["n"], c.params["k"]
            a = rng.standard_normal((m, k), dtype=cp.float32).astype(dt)
            b = rng.standard_normal((k, n), dtype=cp.float32).astype(dt)

            def product(a: Any = a, b: Any = b) -> None:
                with pinned_compute_type(dt, ref):
                    cp.matmul(a, b)

            t_ref += event_time(cp, product, repeats)
        big = rng.standard_normal((peak_n, peak_n), dtype=cp.float32).astype(dt)  # random: zeros run faster

        def peak(big: Any = big) -> None:
            with pinned_compute_type(dt, ref):
                cp.matmul(big, big)

        t_peak = event_time(cp, peak, 3)
        del big
        row.update(
            reference=f"cupy.matmul {ref}",
            ref_tflops=work / t_ref / 1e12,
            ratio=t_ref / t_suite,
            peak_tflops=2 * peak_n**3 / t_peak / 1e12,
            peak_n=peak_n,
        )
        out[dtype] = row
    return out


def _memory_row(cp: Any, backend: Any, rows: list[tuple[Any, float]], repeats: int) -> dict[str, Any]:
    work = sum(march_bytes(backend.plan(c)) for c, _ in rows)
    t_suite = sum(t for _, t in rows)
    words = backend.plan(rows[0][0]).scratch["out"][1]
    backend.close()  # hand the march buffers back before the reference copy takes its own
    cp.get_default_memory_pool().free_all_blocks()
    src = cp.zeros(min(words, 1 << 28), dtype=cp.uint32)
    dst = cp.empty_like(src)
    t_copy = event_time(cp, lambda dst=dst, src=src: cp.copyto(dst, src), repeats)
    copy = 2 * src.nbytes / t_copy
    del src, dst
    return {
        "cases": [c.id for c, _ in rows],
        "suite_gbps": work / t_suite / 1e9,
        "copy_gbps": copy / 1e9,
        "ratio": work / t_suite / copy,
        "gib_marched": words * 4 / 2**30,
    }


def measure_gpu(
    cp: Any,
    index: int,
    rep: SectionReport,
    *,
    runs: int = RUNS,
    repeats: int = REPEATS,
    memory_share: float = MEMORY_SHARE,
    peak_n: int = PEAK_N,
    case_ids: tuple[str, ...] | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Every case this GPU runs, ``runs`` times against its golden (one check each), then the throughput table
    (returned, JSON-able). ``case_ids`` limits the cases (tests). Past ``deadline`` (``time.monotonic()``) no new
    case starts, and a failed check says how many ran: the table of what did run is still returned."""
    import time

    from sdcguard.golden import CupyBackend

    with cp.cuda.Device(index):
        backend = CupyBackend(index, memory_share=memory_share)
        cases = [c for c in backend.cases() if case_ids is None or c.id in case_ids]
        t0 = time.perf_counter()
        backend.prepare(tuple(cases))
        info: dict[str, Any] = {
            "device": backend.device,
            "model": backend.model,
            "arch": backend.arch,
            "sms": backend.sm_count,
            "prepare_s": round(time.perf_counter() - t0, 2),
            "cases": {},
        }
        rep.say(
            f"  cuda:{index} {backend.model} {backend.arch} {backend.sm_count} SMs {backend.device}: "
            f"{len(cases)} cases, prepared in {info['prepare_s']} s"
        )
        timed: dict[str, list[tuple[Any, float]]] = {}
        for k, case in enumerate(cases):
            if deadline is not None and time.monotonic() > deadline:
                rep.check(
                    f"cuda:{index} every case ran within the section's limit",
                    False,
                    f"{k} of {len(cases)} ran; raise the golden-suite limit in sections.py",
                )
                break
            results = [backend.run(case) for _ in range(runs)]
            bad = [r for r in results if not r.passed]
            t = event_time(cp, backend.device_work(case), repeats)
            timed.setdefault(case.family, []).append((case, t))
            info["cases"][case.id] = {"passed": not bad, "ms": t * 1e3}
            detail = (
                f"{t * 1e3:.3f} ms"
                if not bad
                else (
                    f"{len(bad)}/{runs} runs differ: element {bad[0].element} expected {bad[0].expected} actual "
                    f"{bad[0].actual} xor {bad[0].xor_mask} at {bad[0].location}"
                )
            )
            rep.check(f"cuda:{index} {case.id}", not bad, detail)
        if "gemm" in timed:
            info["gemm"] = _gemm_rows(cp, timed["gemm"], repeats, peak_n)
        for fam in ("alu", "ieee", "shared"):
            if fam in timed:
                elems = sum(c.params.get("n", c.size) for c, _ in timed[fam])
                info[fam] = {"gelem_s": elems / sum(t for _, t in timed[fam]) / 1e9}
        if "memory" in timed:
            info["memory"] = _memory_row(cp, backend, timed["memory"], repeats)
        backend.close()
    for line in table_lines(info):
        rep.say("  " + line)
    return info


def table_lines(info: dict[str, Any]) -> list[str]:
    """One GPU's throughput table, as ``benchmarks/suite_gpu.py`` and the log print it."""
    lines = [f"{'family':11} {'suite':>14} {'reference':>14} {'ratio':>6} {'peak':>14}  reference"]
    for dtype, g in info.get("gemm", {}).items():
        if "ref_tflops" in g:
            lines.append(
                f"gemm.{dtype:6} {g['suite_tflops']:>9.2f} TF/s {g['ref_tflops']:>9.2f} TF/s "
                f"{g['ratio']:>6.2f} {g['peak_tflops']:>9.2f} TF/s  {g['reference']}"
            )
        else:
            lines.append(
                f"gemm.{dtype:6} {g['suite_tflops']:>9.2f} TF/s {'-':>14} {'-':>6} {'-':>14}  {g['reference']}"
            )
    if "memory" in info:
        m = info["memory"]
        lines.append(
            f"{'memory':11} {m['suite_gbps']:>9.1f} GB/s {m['copy_gbps']:>9.1f} GB/s {m['ratio']:>6.2f} "
            f"{'-':>14}  device copy ({m['gib_marched']:.2f} GiB marched)"
        )
    for fam in ("alu", "ieee", "shared"):
        if fam in info:
            lines.append(f"{fam:11} {info[fam]['gelem_s']:>9.2f} Ge/s")
    return lines


def run(ctx: Context, rep: SectionReport) -> str:
    from sdcguard.golden import default_suite
    from sdcguard.golden.launch import plan_for, runs_on_kernels

    suite = default_suite()
    kernel_cases = [c for c in suite.cases if runs_on_kernels(c)]
    planned = [plan_for(c, suite.inputs(c), sm_count=132) for c in kernel_cases]
    rep.check(
        "every kernel-run case has a launch plan",
        len(planned) == len(kernel_cases),
        f"{len(planned)} plans, {sum(len(p.launches) for p in planned)} launches",
    )
    ctx.require_gpu(
        f"run the {len(suite.cases)} golden cases {RUNS} times on every GPU against the goldens and "
        f"time them next to cupy.matmul and a device-to-device copy"
    )
    import time

    import cupy as cp

    gpus = {}
    count = cp.cuda.runtime.getDeviceCount()
    for index in range(count):
        # keep a share of what is left for the references (matmuls, copy) of the cases that ran
        deadline = time.monotonic() + ctx.left(margin=20.0) / (count - index)
        gpus[f"cuda:{index}"] = measure_gpu(cp, index, rep, deadline=deadline)
        rep.measure("gpus", gpus)
    cases = sum(len(g["cases"]) for g in gpus.values())
    return f"{cases} cases x {RUNS} runs bit-exact on {len(gpus)} GPU(s); throughput in results.json"
