"""Every golden family on every visible GPU against the goldens, with each family's throughput next to the
device's own reference measured in the same run: GEMM TFLOP/s against ``cupy.matmul`` on random data of the same
shapes and compute type (and at 8192^3, the practical peak), memory GB/s against a device-to-device copy.

The measurement is the ``golden-suite`` section of the GPU check (``scripts/gpu_check/golden_suite.py``, where the
method is described); this prints its table, live or from a recorded run::

    python benchmarks/suite_gpu.py                                   # on a CUDA machine
    python benchmarks/suite_gpu.py --from benchmarks/gpu_check/<run>/results.json

Exit status: 0 when every case passed on every GPU, 1 when any failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT), str(_ROOT / "scripts")]

from gpu_check.golden_suite import MEMORY_SHARE, REPEATS, RUNS, measure_gpu, table_lines  # noqa: E402
from gpu_check.results import SectionReport  # noqa: E402


def _print(gpus: dict[str, Any]) -> int:
    failed = 0
    for name, info in gpus.items():
        print(f"\n== {name} {info['model']} {info['arch']} {info['sms']} SMs {info['device']}")
        bad = [cid for cid, c in info["cases"].items() if not c["passed"]]
        failed += len(bad)
        print(f"  {len(info['cases'])} cases, " + (f"FAILED: {', '.join(bad)}" if bad else "all passed"))
        for line in table_lines(info):
            print("  " + line)
    return 1 if failed else 0


def _recorded(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"suite_gpu: cannot read {path}: {e}") from None
    for s in body.get("sections", []):
        if s.get("section") == "golden-suite" and "gpus" in s.get("measurements", {}):
            return dict(s["measurements"]["gpus"])
    raise SystemExit(f"suite_gpu: {path} has no measured golden-suite section")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="recorded", type=Path, help="print the tables of a GPU check's results.json")
    ap.add_argument("--runs", type=int, default=RUNS, help="compared runs of each case")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed runs of each case (the fastest counts)")
    ap.add_argument("--memory-share", type=float, default=MEMORY_SHARE, help="share of free memory marched")
    args = ap.parse_args()
    if args.recorded is not None:
        return _print(_recorded(args.recorded))
    import cupy as cp

    rep = SectionReport("golden-suite")
    gpus = {
        f"cuda:{i}": measure_gpu(cp, i, rep, runs=args.runs, repeats=args.repeats, memory_share=args.memory_share)
        for i in range(cp.cuda.runtime.getDeviceCount())
    }
    return _print(gpus)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            sys.exit(2)
        raise
