"""What verified checkpoints cost against plain ``torch.distributed.checkpoint``: save and load of the same state
dict, side by side in one run, interleaved so the machine's noise hits both alike.

The state dict is a model of ``--layers`` linear layers of ``--width`` squared (fp32) with AdamW's state (three
times the parameter bytes in all), in one process. ``sdcguard.checkpoint.save`` adds one fingerprint pass over
every tensor (on its device) and a small JSON file; ``load`` adds one fingerprint pass after reading. Run::

    python benchmarks/checkpoint_overhead.py [--layers 8] [--width 2048] [--repeats 5] [--dir DIR]

``--dir`` chooses the file system (default: a temporary directory); on a page-cached local disk the pass over the
data is a larger share than on shared storage, where reading and writing dominate.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
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
    print(f"state dict: {args.layers} x Linear({args.width}) + AdamW state = {nbytes / 1e6:.0f} MB, one process, "
          f"{args.repeats} interleaved repeats, files under {args.dir or tempfile.gettempdir()}")
    for op in ("save", "load"):
        base, ours = med[f"dcp {op}"], med[f"sdcguard {op}"]
        ratios = sorted(b / a - 1 for a, b in zip(times[f"dcp {op}"], times[f"sdcguard {op}"]))
        print(f"{op}: DCP {base:.3f} s ({nbytes / base / 1e9:.2f} GB/s), sdcguard {ours:.3f} s: "
              f"{statistics.median(ratios):+.1%} (range {ratios[0]:+.1%} .. {ratios[-1]:+.1%})")


if __name__ == "__main__":
    main()
