"""What the matmul checksum checks cost and what each setting buys, on the benchmark transformer, in one process.

``replay_overhead.py`` measures the checks inside 2-worker DDP steps by wall clock; on a shared machine its rounds
scatter by tens of percent. This one measures the same model's forward and backward in one process and one torch
thread by the thread's CPU time (what the checks themselves consume, unaffected by other processes' load),
configurations interleaved in rounds, paired per round:

- ``plain``: forward + backward, no checks;
- ``rows=N``: the same step with every matmul checked (:class:`sdcguard.training.checksums.mode.ChecksumMode`, a checked
  step) at ``checksum_rows=N``; the average over ``checksum_every=E`` is that cost over ``E``.

What each ``checksum_rows`` buys: on one checked step, every matmul's result is corrupted in sampled entries, one bit
class at a time (a copy of the result, so the step itself is not changed), and checked against its operands; the
share caught per class is printed (fp32; low mantissa flips are under the rounding bound by design).

Run::

    python benchmarks/checksum_cost.py [--rounds 8] [--rows 16,32,64,128] [--samples 20] [--json FILE]

``--parts`` also times, on one checked step's matmuls (their operands and results recorded), where a check's time
goes: the matmuls themselves, the check as it runs (with the screen; on the CPU the block sums and the screen's
first tiers in the C engine where it was built), the check with every column's magnitudes, the reference matmul
alone, and the block sums of ``A`` and of ``C`` as torch ops (what the C engine replaces).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch  # noqa: E402
from sdcguard.training.checksums.bound import c_engine_available, check_matmul  # noqa: E402
from sdcguard.training.checksums.mode import ChecksumMode  # noqa: E402

CLASSES = {
    "sign": [31],
    "exponent (top bit)": [30],
    "exponent (low bits)": [23, 24, 25],
    "high mantissa (22-20)": [22, 21, 20],
    "mid mantissa (19-16)": [19, 18, 17, 16],
    "low mantissa (7-0)": list(range(8)),
}


def _flip(c: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    flat = c.detach().clone().reshape(-1)
    word = flat.view(torch.int32)
    word[index] ^= (1 << bit) if bit < 31 else -(1 << 31)
    return flat.reshape(c.shape)


class _Coverage(ChecksumMode):
    """A checked step that also checks corrupted copies of every matmul result, at several ``rows`` settings."""

    def __init__(self, module: torch.nn.Module, rows: list[int], samples: int) -> None:
        super().__init__(module)
        self.settings, self.samples = rows, samples
        self.g = torch.Generator().manual_seed(1)
        self.hits = {r: dict.fromkeys(CLASSES, 0) for r in rows}
        self.tried = dict.fromkeys(CLASSES, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm") and func._overloadname == "default" and out.dtype == torch.float32:
            a, b, bias = (args[0], args[1], None) if name != "addmm" else (args[1], args[2], args[0])
            from sdcguard.training.checksums.precision import precision_for

            p = precision_for(out.dtype, out.device)
            assert p is not None
            for i in torch.randint(0, out.numel(), (self.samples,), generator=self.g).tolist():
                for cls, bits in CLASSES.items():
                    bad = _flip(out, i, bits[i % len(bits)])
                    self.tried[cls] += 1
                    for r in self.settings:
                        self.hits[r][cls] += int(check_matmul(a, b, bad, bias=bias, precision=p, rows=r)) > 0
        return out


class _Recorder(TorchDispatchMode):
    """Keeps the operands and result of every fp32 mm / addmm / bmm of a step (what the checks see)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm") and func._overloadname == "default" and out.dtype == torch.float32:
            a, b, bias = (args[0], args[1], None) if name != "addmm" else (args[1], args[2], args[0])
            self.calls.append((a, b, out, bias))
        return out


def _parts(model: torch.nn.Module, batch: Any, rounds: int, rows: int) -> dict[str, float]:
    """Milliseconds of CPU time per step for each part of the checks, on one step's recorded matmuls."""
    from sdcguard.training.checksums.precision import precision_for

    rec = _Recorder()
    with rec:
        lm_loss(model, batch).backward()
    model.zero_grad(set_to_none=True)
    p = precision_for(torch.float32, torch.device("cpu"))

    def blocks(x: torch.Tensor) -> torch.Tensor:
        m = x.shape[-2] // rows * rows
        return x[..., :m, :].reshape(*x.shape[:-2], m // rows, rows, x.shape[-1]).sum(dim=-2)

    sums = [blocks(a) for a, _, _, _ in rec.calls]
    parts: dict[str, Any] = {
        "the matmuls themselves": lambda a, b, c, v, s: torch.matmul(a, b) if v is None else torch.addmm(v, a, b),
        "check (as it runs)": lambda a, b, c, v, s: check_matmul(a, b, c, bias=v, precision=p, rows=rows),
        "check, every column's magnitudes": lambda a, b, c, v, s: check_matmul(
            a, b, c, bias=v, precision=p, rows=rows, screen=False
        ),
        "  of which the reference matmul V @ B": lambda a, b, c, v, s: torch.matmul(s, b),
        "  block sums of A, torch ops": lambda a, b, c, v, s: blocks(a),
        "  block sums of C, torch ops": lambda a, b, c, v, s: blocks(c),
    }
    spent: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(rounds):
        for k, f in parts.items():
            t0 = time.thread_time()
            for (a, b, c, v), s in zip(rec.calls, sums):
                f(a, b, c, v, s)
            spent[k].append(time.thread_time() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rows", default="16,32,64,128")
    ap.add_argument("--samples", type=int, default=20, help="corrupted entries per matmul per class (coverage)")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--parts", action="store_true", help="also time the parts of a check (see the docstring)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyTransformer(d=args.d, heads=4, layers=args.layers, seq=args.seq, p=0.1)
    batch = make_batch(0, 0, batch=args.batch, seq=args.seq)
    modes = {r: ChecksumMode(model, rows=r) for r in rows}

    def step(name: str) -> float:
        mode = modes.get(int(name.split("=")[1])) if name != "plain" else None
        t0 = time.thread_time()
        if mode is not None:
            mode.begin()
        lm_loss(model, batch).backward()
        if mode is not None and mode.end():
            raise RuntimeError(f"{name}: a clean step failed its checksums")
        spent = time.thread_time() - t0
        model.zero_grad(set_to_none=True)
        return spent

    names = ["plain", *(f"rows={r}" for r in rows)]
    for n in names:
        step(n)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            times[n].append(step(n))
    base = statistics.median(times["plain"])
    out: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "c_engine": c_engine_available(),
        "plain_cpu_s": base,
        "checked": {},
        "coverage": {},
    }
    print(
        f"transformer d={args.d} layers={args.layers} seq={args.seq} batch={args.batch}, one thread, "
        f"{args.rounds} rounds; forward+backward {base * 1e3:.1f} ms CPU; matmuls per step: "
        f"{modes[rows[0]].checked} checked of {modes[rows[0]].run} run; block sums and screen: "
        f"{'the C engine' if c_engine_available() else 'torch ops (the C engine was not built)'}"
    )
    print(
        f"{'setting':<12}{'checked step (median, IQR)':>30}" + "".join(f"{f'every={e}':>10}" for e in (1, 2, 3, 4, 6))
    )
    for r in rows:
        ratios = sorted(a / b - 1 for a, b in zip(times[f"rows={r}"], times["plain"]))
        q = statistics.quantiles(ratios, n=4)
        med = statistics.median(ratios)
        out["checked"][r] = {"median": med, "q1": q[0], "q3": q[2]}
        print(
            f"{f'rows={r}':<12}{med:>+16.1%} [{q[0]:+.1%}, {q[2]:+.1%}]"
            + "".join(f"{med / e:>+10.1%}" for e in (1, 2, 3, 4, 6))
        )
    cov = _Coverage(model, rows, args.samples)
    cov.begin()
    lm_loss(model, batch).backward()
    cov.end()
    print(
        f"\nfaults caught on a checked step, by bit class ({args.samples} entries per matmul per class, "
        f"{cov.tried['sign']} per class):"
    )
    print(f"{'class':<24}" + "".join(f"{f'rows={r}':>10}" for r in rows))
    for cls in CLASSES:
        shares = {r: cov.hits[r][cls] / max(1, cov.tried[cls]) for r in rows}
        out["coverage"][cls] = shares
        print(f"{cls:<24}" + "".join(f"{shares[r]:>10.0%}" for r in rows))
    if args.parts:
        out["parts_ms"] = _parts(model, batch, args.rounds, 32)
        print(f"\nwhere a checked step's check time goes (rows=32, one step's matmuls, CPU ms, {args.rounds} rounds):")
        for k, v in out["parts_ms"].items():
            print(f"{k:<40}{v:>8.1f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
