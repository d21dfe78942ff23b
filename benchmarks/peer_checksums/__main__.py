"""``python -m benchmarks.peer_checksums``: the command line of the comparison (see the package's docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/peer_checksums`: the repository instead of this folder
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from benchmarks.peer_checksums import __doc__ as _overview  # noqa: E402
from benchmarks.peer_checksums.processes import PEER_SPEC, TORCH_SPEC, log  # noqa: E402
from benchmarks.peer_checksums.report import markdown  # noqa: E402
from benchmarks.peer_checksums.run import run  # noqa: E402
from benchmarks.peer_checksums.worker import ROOT  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.peer_checksums",
        description=(_overview or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--faults", type=int, default=20, help="faults per class (default 20)")
    p.add_argument("--clean", type=int, default=200, help="clean checked training steps per tool (default 200)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16 (bf16: CPU autocast)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved timing rounds (default 6)")
    p.add_argument("--round-steps", type=int, default=3, help="steps per configuration per round (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every figure and fault record here")
    p.add_argument("--venv", default=str(ROOT / ".venv-peer"), help="the peer's virtualenv (created if missing)")
    p.add_argument("--torch-spec", default=os.environ.get("SDCGUARD_TORCH_SPEC", TORCH_SPEC))
    p.add_argument("--peer-spec", default=PEER_SPEC)
    p.add_argument("--ours-python", help="python of the project's virtualenv (default .venv/bin/python)")
    p.add_argument("--no-peer", action="store_true", help="ours only")
    p.add_argument("--workdir", help="where the workers' logs and the peer's pip log go (default: a temp dir)")
    p.add_argument("--render", metavar="JSON", help="print the table of an earlier run's --json file, and exit")
    return p


def main() -> int:
    args = _parser().parse_args()
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text())))
        return 0
    res = run(args)
    table = markdown(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        log(f"wrote {args.json}")
    print(table)
    log(f"done in {res['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
