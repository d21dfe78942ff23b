"""Section ``fingerprint``: ``sdcguard.fingerprint`` on CUDA equals the CPU reference over a sweep of dtypes,
shapes and strides, through every CUDA path; and its bandwidth next to a device-to-device copy.

The CUDA paths: a torch CUDA tensor through the fused kernel (cupy present), the same tensor through torch ops
(cupy hidden, as on a machine without it), a cupy array of the same memory (DLPack), and ``fingerprint_many`` over
the whole sweep at once. The reference is the fingerprint of the view's raw bytes in logical order, copied to the
host (the CPU engine): by definition the fingerprint depends on nothing else. A flipped bit in device memory must
change every path's value.

Bandwidth: one dense tensor of ``BANDWIDTH_BYTES``; the fingerprint reads it once, a copy reads and writes it.
``share`` is the fingerprint's bytes per second over the copy's (1.0: the fingerprint runs at copy speed), both
wall-clock times including the host sync, fastest of a few.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .context import Context
from .results import SectionReport

__all__ = ["run", "SweepCase", "sweep", "reference", "check_sweep", "bandwidth", "cupy_hidden", "BANDWIDTH_BYTES"]

BANDWIDTH_BYTES = 4 << 30
"""Bytes of the tensor timed for bandwidth (several times the L2, far from launch overhead)."""

_CHUNK_WORDS = 1 << 14  # sdcguard.fingerprints.CHUNK_WORDS: sizes just around a chunk are the interesting ones


@dataclass(frozen=True)
class SweepCase:
    name: str
    base: Any
    """A CPU tensor of random bits."""
    view: Callable[[Any], Any]
    """The view taken of the base (the same on the CPU and on the GPU copy)."""


def _dtypes(torch: Any) -> list[Any]:
    names = [
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "bool",
        "complex64",
        "float8_e4m3fn",
    ]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def _random(torch: Any, shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(
        0, 256, (*shape[:-1], shape[-1] * itemsize) if shape else (itemsize,), dtype=torch.uint8, generator=g
    )
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaNs included: the fingerprint is of bits


_VIEWS: dict[str, Callable[[Any], Any]] = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.transpose(0, -1),
    "step2": lambda x: x[..., ::2],
    "offset1": lambda x: x.reshape(-1)[1:],  # misaligned start for 1- and 2-byte dtypes
    "narrow": lambda x: x[..., 1:-1],
    "expanded": lambda x: x[:1].expand(3, *x.shape[1:]),  # stride 0
    "conj": lambda x: x.conj(),  # a lazy conjugate (complex only)
}


def sweep(torch: Any, *, large: int = 3 << 20, huge: bool = False) -> list[SweepCase]:
    """Every dtype x shape x view worth checking; ``large`` elements for the big shapes. ``huge`` adds strided
    views of more than 64 MiB, which a GPU fingerprints through several staging blocks."""
    shapes: list[tuple[int, ...]] = [
        (),
        (0,),
        (1,),
        (3,),
        (5, 7),
        (_CHUNK_WORDS + 1,),
        (3, 33, 65),
        (2, 2 * _CHUNK_WORDS + 3),
        (large + 5,),
        (3, large // 3 + 1),
    ]
    cases = []
    seed = 0
    for dtype in _dtypes(torch):
        for shape in shapes:
            seed += 1
            base = _random(torch, shape, dtype, seed)
            for vname, fn in _VIEWS.items():
                if len(shape) < 2 and vname in ("transposed", "narrow", "expanded"):
                    continue
                if vname == "conj" and not dtype.is_complex:
                    continue
                if vname in ("step2", "offset1") and not shape:
                    continue
                if shape and shape[-1] < 3 and vname == "narrow":
                    continue
                cases.append(
                    SweepCase(name=f"{str(dtype).replace('torch.', '')}{list(shape)}.{vname}", base=base, view=fn)
                )
    if huge:
        square = _random(torch, (4100, 4100), torch.float32, seed + 1)  # 67 MB: two 64 MiB staging blocks
        cases += [
            SweepCase(name=f"float32[4100, 4100].{v}", base=square, view=_VIEWS[v])
            for v in ("contiguous", "transposed", "step2")
        ]
        flat = _random(torch, ((64 << 20) + 5,), torch.uint8, seed + 2)
        cases.append(SweepCase(name="uint8[67108869].offset1", base=flat, view=_VIEWS["offset1"]))
    return cases


def reference(view_cpu: Any) -> int:
    """The fingerprint of a CPU view's raw bytes in logical order (the CPU engine on a numpy byte array)."""
    import torch

    from sdcguard.fingerprints import fingerprint

    dense = view_cpu.resolve_conj().resolve_neg()
    # a fresh tensor, not .contiguous(): that keeps the odd stride of a size-1 dimension, which view() refuses
    flat = torch.empty(dense.shape, dtype=dense.dtype).copy_(dense).reshape(-1)
    return fingerprint(flat.view(torch.uint8).numpy())


@contextlib.contextmanager
def cupy_hidden() -> Iterator[None]:
    """Inside the block ``import cupy`` fails, as on a machine without cupy: torch CUDA tensors then take the
    fingerprint's torch-op path."""
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = None
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved


def _cupy_of(view: Any) -> Any | None:
    """A cupy array over the same device memory, or None where cupy cannot take the dtype (bf16, fp8)."""
    try:
        import cupy

        return cupy.from_dlpack(view)
    except Exception:
        return None


def check_sweep(
    rep: SectionReport, device: Any, cases: list[SweepCase], *, with_cupy: bool, deadline: float | None = None
) -> dict[str, Any]:
    """Compare every path on ``device`` with the CPU reference; one check per path, naming the first few cases
    that differ or raise (an error in one case does not hide the others). Past ``deadline`` (``time.monotonic()``)
    no new case starts, and a failed check says how many ran."""
    from sdcguard.fingerprints import fingerprint, fingerprint_many

    misses: dict[str, list[str]] = {"fused": [], "torch-ops": [], "cupy": [], "many": []}
    cupy_ran = 0
    views, refs = [], []

    def attempt(path: str, name: str, fn: Callable[[], int], want: int) -> None:
        try:
            if fn() != want:
                misses[path].append(name)
        except Exception as e:
            misses[path].append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")

    ran = 0
    for c in cases:
        if deadline is not None and time.monotonic() > deadline:
            break
        ran += 1
        want = reference(c.view(c.base))
        dev = c.view(c.base.to(device))
        views.append(dev)
        refs.append(want)
        attempt("fused", c.name, lambda: fingerprint(dev), want)
        with cupy_hidden():
            attempt("torch-ops", c.name, lambda: fingerprint(dev), want)
        if with_cupy:
            arr = _cupy_of(dev)
            if arr is not None:
                cupy_ran += 1
                attempt("cupy", c.name, lambda: fingerprint(arr), want)
    if ran < len(cases):
        rep.check("every sweep case ran within the section's limit", False, f"{ran} of {len(cases)} ran")
        cases = cases[:ran]
    try:
        batched = fingerprint_many(views)
        misses["many"] = [c.name for c, v, r in zip(cases, batched, refs) if v != r]
    except Exception as e:
        misses["many"] = [f"{type(e).__name__}: {e}"]
    n = len(cases)
    labels = {
        "fused": f"{device.type} tensors (fused kernel where cupy is present) equal the CPU reference",
        "torch-ops": f"{device.type} tensors through torch ops (no cupy) equal the CPU reference",
        "cupy": "cupy arrays of the same memory equal the CPU reference",
        "many": "fingerprint_many over the whole sweep equals one by one",
    }
    for path, label in labels.items():
        if path == "cupy" and not with_cupy:
            continue
        count = cupy_ran if path == "cupy" else n
        rep.check(
            label,
            not misses[path],
            f"{count - len(misses[path])}/{count} agree"
            + (f"; differ: {', '.join(misses[path][:4])}" if misses[path] else ""),
        )
    return {"cases": n, "cupy_cases": cupy_ran, "misses": {k: v for k, v in misses.items() if v}}


def check_flips(rep: SectionReport, device: Any) -> None:
    """A bit flipped in device memory changes every path's fingerprint."""
    import torch

    from sdcguard.fingerprints import fingerprint

    x = _random(torch, (4 * _CHUNK_WORDS + 7,), torch.float32, 99).to(device)
    before = fingerprint(x)
    with cupy_hidden():
        before_ops = fingerprint(x)
    changed = []
    for word, bit in ((0, 0), (_CHUNK_WORDS - 1, 31), (_CHUNK_WORDS, 16), (4 * _CHUNK_WORDS + 6, 7)):
        w = x.view(torch.int32)
        w[word] ^= (1 << bit) if bit < 31 else -(1 << 31)
        after = fingerprint(x)
        with cupy_hidden():
            after_ops = fingerprint(x)
        changed.append(after != before and after_ops != before_ops and after == after_ops)
        w[word] ^= (1 << bit) if bit < 31 else -(1 << 31)
    rep.check(
        "a bit flipped in device memory changes the fingerprint (both paths)",
        all(changed),
        f"{sum(changed)}/{len(changed)} flips seen",
    )


def _best(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def bandwidth(device: Any, nbytes: int, *, repeats: int = 5) -> dict[str, Any]:
    """Fingerprint (fused, and torch ops) against a device-to-device copy of the same bytes."""
    import torch

    from sdcguard.fingerprints import fingerprint

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.randint(-(2**31), 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=device)
    y = torch.empty_like(x)
    # x and y bound as defaults, not closed over: the del below frees them before the next size's allocation
    t_copy = _best(lambda x=x, y=y: y.copy_(x), sync, repeats)
    t_fp = _best(lambda x=x: fingerprint(x), sync, repeats)
    with cupy_hidden():
        t_ops = _best(lambda x=x: fingerprint(x), sync, max(1, repeats // 2))
    del x, y
    copy_gbps = 2 * nbytes / t_copy / 1e9  # read + written
    return {
        "bytes": nbytes,
        "copy_gbps": copy_gbps,
        "copy_ms": t_copy * 1e3,
        "fused_gbps": nbytes / t_fp / 1e9,
        "fused_ms": t_fp * 1e3,
        "fused_share": nbytes / t_fp / 1e9 / copy_gbps,
        "torch_ops_gbps": nbytes / t_ops / 1e9,
        "torch_ops_ms": t_ops * 1e3,
        "torch_ops_share": nbytes / t_ops / 1e9 / copy_gbps,
    }


def run(ctx: Context, rep: SectionReport) -> str:
    import torch

    # a dry run builds the same cases, small (its GPU steps are skipped anyway)
    cases = sweep(torch, large=3 << 20 if not ctx.dry_run else 4096, huge=not ctx.dry_run)
    rep.check("the sweep builds", len(cases) > 100, f"{len(cases)} dtype x shape x view cases")
    ctx.require_gpu(
        f"compare {len(cases)} CUDA fingerprints (fused, torch ops, cupy, batched) with the CPU "
        f"reference and time the fingerprint of {BANDWIDTH_BYTES >> 30} GiB against a device copy"
    )
    rep.check("torch sees CUDA", torch.cuda.is_available(), f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    device = torch.device("cuda", ctx.device)
    torch.cuda.set_device(device)
    # the bandwidth and the flips need a few seconds after the sweep
    deadline = time.monotonic() + ctx.left(margin=15.0)
    rep.measure("sweep", check_sweep(rep, device, cases, with_cupy=True, deadline=deadline))
    check_flips(rep, device)
    bw = rep.measure("bandwidth", bandwidth(device, BANDWIDTH_BYTES))
    rep.say(
        f"  bandwidth: copy {bw['copy_gbps']:.0f} GB/s (read+write); fingerprint fused {bw['fused_gbps']:.0f} "
        f"GB/s = {bw['fused_share']:.2f} of copy; torch ops {bw['torch_ops_gbps']:.0f} GB/s = "
        f"{bw['torch_ops_share']:.2f} of copy"
    )
    return (
        f"{len(cases)} cases equal on every path; fingerprint at {bw['fused_share']:.2f} of a device copy's "
        f"bandwidth ({bw['fused_gbps']:.0f} vs {bw['copy_gbps']:.0f} GB/s)"
    )
