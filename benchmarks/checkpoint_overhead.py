"""What verified checkpoints cost against plain ``torch.distributed.checkpoint``, side by side in one run on the
same state dict, interleaved so the machine's noise hits every variant alike:

1. synchronous ``save`` and ``load`` against DCP's;
2. the time the training loop is blocked by ``sdcguard.checkpoint.async_save`` against a synchronous DCP save and
   against DCP's own ``async_save`` (as it comes, and with the same cached stager sdcguard keeps, which isolates
   the cost of the fingerprints); each save is waited for, untimed, before the next;
3. the read rate of ``sdcguard scrub`` against ``cat`` of the same files to ``/dev/null``, the files' pages
   dropped from the page cache before each (``fsync`` + ``posix_fadvise(DONTNEED)``).

The state dict is a model of ``--layers`` linear layers of ``--width`` squared (fp32) with AdamW's state (three
times the parameter bytes in all), in one process. Run::

    python benchmarks/checkpoint_overhead.py [--layers 8] [--width 2048] [--repeats 5] [--dir DIR]

``--dir`` chooses the file system (default: a temporary directory); on a page-cached local disk the pass over the
data is a larger share than on shared storage, where reading and writing dominate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    import torch.distributed.checkpoint as dcp
    from torch import nn

    from sdcguard import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, args.width)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    root = Path(tempfile.mkdtemp(dir=args.dir))
    times: dict[str, list[float]] = {"dcp save": [], "sdcguard save": [], "dcp load": [], "sdcguard load": []}
    try:
        for r in range(args.repeats + 1):  # the first round warms the page cache up
            for kind in ("dcp", "sdcguard"):
                path = root / f"{kind}{r}"
                t0 = time.perf_counter()
                if kind == "dcp":
                    dcp.save(state, checkpoint_id=str(path))
                else:
                    checkpoint.save(state, checkpoint_id=path)
                t1 = time.perf_counter()
                if kind == "dcp":
                    dcp.load(state, checkpoint_id=str(path))
                else:
                    checkpoint.load(state, checkpoint_id=path)
                t2 = time.perf_counter()
                if r:
                    times[f"{kind} save"].append(t1 - t0)
                    times[f"{kind} load"].append(t2 - t1)
                shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"state dict: {args.layers} x Linear({args.width}) + AdamW state = {nbytes / 1e6:.0f} MB, one process, "
        f"{args.repeats} interleaved repeats, files under {args.dir or tempfile.gettempdir()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (1 min) at the end"
    )
    for op in ("save", "load"):
        base, ours = med[f"dcp {op}"], med[f"sdcguard {op}"]
        ratios = sorted(b / a - 1 for a, b in zip(times[f"dcp {op}"], times[f"sdcguard {op}"]))
        print(
            f"{op}: DCP {base:.3f} s ({nbytes / base / 1e9:.2f} GB/s), sdcguard {ours:.3f} s: "
            f"{statistics.median(ratios):+.1%} (range {ratios[0]:+.1%} .. {ratios[-1]:+.1%})"
        )
    blocked(state, args)
    scrub_rate(state, nbytes, args)


def blocked(state: dict[str, object], args: argparse.Namespace) -> None:
    """Seconds the training loop waits for each kind of save to return (the write itself finishes untimed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from sdcguard import checkpoint

    saver = checkpoint.AsyncCheckpointer()
    cached = DefaultStager(StagingOptions(False, False, False, False))
    kinds = ("dcp save", "dcp async_save", "dcp async_save, cached stager", "sdcguard async_save")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        for r in range(args.repeats + 1):  # the first round allocates the cached staging buffers
            for kind in kinds:
                path = root / f"{len(kind)}-{r}"
                t0 = time.perf_counter()
                if kind == "dcp save":
                    dcp.save(state, checkpoint_id=str(path))
                    done = None
                elif kind == "dcp async_save":
                    done = dcp.async_save(state, checkpoint_id=str(path))
                elif kind == "dcp async_save, cached stager":
                    done = dcp.async_save(state, checkpoint_id=str(path), async_stager=cached)
                else:
                    saver.save(state, checkpoint_id=path, step=r)
                    done = None
                t1 = time.perf_counter()
                if kind == "sdcguard async_save":
                    info = saver.wait()
                    assert info is not None and info.saved, info
                elif done is not None:
                    (done.upload_completion if hasattr(done, "upload_completion") else done).result()
                if r:
                    times[kind].append(t1 - t0)
                shutil.rmtree(path)
    finally:
        saver.close()
        cached.close()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ours = times["sdcguard async_save"]
    print("training loop blocked per save (median): " + ", ".join(f"{k} {v:.3f} s" for k, v in med.items()))
    for base, goal in (
        ("dcp save", "goal <= 0.20"),
        ("dcp async_save", "goal <= 1.10"),
        ("dcp async_save, cached stager", "same staging: the fingerprints' cost"),
    ):
        ratios = sorted(a / b for a, b in zip(ours, times[base]))
        print(
            f"  sdcguard async_save / {base}: {statistics.median(ratios):.3f} "
            f"(range {ratios[0]:.3f} .. {ratios[-1]:.3f}; {goal})"
        )


def _drop(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def scrub_rate(state: dict[str, object], nbytes: int, args: argparse.Namespace) -> None:
    """The scrub's read rate against cat's, the page cache dropped for the files before each."""
    from sdcguard import checkpoint
    from sdcguard.checkpoint.scrub import scrub_one

    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        checkpoint.save(state, checkpoint_id=root / "c")
        files = sorted((root / "c").iterdir())
        size = sum(f.stat().st_size for f in files)
        times: dict[str, list[float]] = {"cat": [], "scrub": []}
        for _ in range(args.repeats):
            for kind in times:
                _drop(files)
                t0 = time.perf_counter()
                if kind == "cat":
                    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
                else:
                    result = scrub_one(root / "c")
                    assert result.status == "clean", result
                times[kind].append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rates = {k: size / statistics.median(v) / 1e9 for k, v in times.items()}
    ratios = sorted(c / s for c, s in zip(times["cat"], times["scrub"]))
    print(
        f"scrub of {size / 1e6:.0f} MB, page cache dropped before each: cat {rates['cat']:.2f} GB/s, scrub "
        f"{rates['scrub']:.2f} GB/s: {statistics.median(ratios):.0%} of cat (range {ratios[0]:.0%} .. "
        f"{ratios[-1]:.0%}; goal >= 80%)"
    )


if __name__ == "__main__":
    main()
