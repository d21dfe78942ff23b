"""``python -m gpu_check COMMAND``: the steps ``scripts/gpu_check.sh`` calls, one process each.

    begin   --out DIR [--dry-run]          start DIR/results.json with what this machine is; print it
    plan    [--only LIST]                  the sections to run: "name limit_s" per line
    run     NAME --out DIR --timeout S     run one section and record its outcome
    finish  NAME --out DIR --rc RC ...     record a section that ended without an outcome; print its verdict
    summary --out DIR [--dry-run]          print every verdict and the summary line; exit 1 on any FAIL
    promote FILE... [--golden-dir DIR]     record intrinsics goldens from candidate files of >= 2 devices

Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sqlite3
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .context import Context, Skip
from .results import Outcome, SectionReport, begin, load, record, summary_line, verdict_line
from .sections import TOTAL_LIMIT_S, section_by_name, select

__all__ = ["main"]

_ROOT = Path(__file__).resolve().parents[2]


def _gpus() -> list[dict[str, Any]]:
    """What NVML (else CUDA) says about each GPU; empty without either."""
    try:
        from fleet_scan.devices.discovery import discover_gpus

        found = [
            {"index": t.index, "id": t.device, "model": t.info.model, "pci": t.info.pci_bus_id, "driver": t.driver}
            for t in discover_gpus()
        ]
    except Exception as e:  # NVML's own failure is the nvml section's business: note it here and go on
        found = [{"nvml_error": f"{type(e).__name__}: {e}"}]
    from .context import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        import cupy

        for i in range(cupy.cuda.runtime.getDeviceCount()):
            p = cupy.cuda.runtime.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            found.append(
                {
                    "cuda_index": i,
                    "name": name,
                    "arch": f"sm_{p['major']}{p['minor']}",
                    "sms": int(p["multiProcessorCount"]),
                    "memory_gib": round(p["totalGlobalMem"] / 2**30, 1),
                }
            )
    return found


def _run_info(dry_run: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": dry_run,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "limit_s": TOTAL_LIMIT_S,
    }
    try:
        info["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None  # the device machine gets a copy of the tree without .git
    info["sqlite"] = sqlite3.sqlite_version  # the fleet store's SQLite: the standard library's
    for name in ("numpy", "torch", "cupy", "pynvml"):
        try:
            module = __import__(name)
            info[name] = str(getattr(module, "__version__", "present"))
        except Exception as e:
            info[name] = f"missing ({type(e).__name__})"
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
    except Exception:
        pass
    info["gpus"] = _gpus()
    return info


def _cmd_begin(args: argparse.Namespace) -> int:
    info = _run_info(args.dry_run)
    begin(args.out, info)
    print(f"gpu_check: {'dry run, ' if args.dry_run else ''}results in {args.out}")
    for key in ("host", "commit", "python", "executable", "numpy", "torch", "torch_cuda", "cupy", "pynvml", "sqlite"):
        print(f"  {key}: {info.get(key)}")
    for gpu in info["gpus"]:
        print("  gpu: " + ", ".join(f"{k}={v}" for k, v in gpu.items()))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    for s in select(args.only):
        print(f"{s.name} {s.timeout_s}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    section = section_by_name(args.name)
    ctx = Context(out=args.out, dry_run=args.dry_run, timeout_s=args.timeout, device=args.device)
    rep = SectionReport(section.name)
    rep.say(f"== {section.name}: {section.title} (limit {args.timeout:.0f} s)")
    skip = error = passed = None
    try:
        passed = section.runner()(ctx, rep)
    except Skip as e:
        skip = str(e)
    except Exception as e:
        traceback.print_exc()
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    outcome = rep.outcome(
        seconds=time.monotonic() - ctx.started, timeout_s=args.timeout, skip=skip, error=error, passed=passed
    )
    record(args.out, outcome)
    return 0


def _cmd_finish(args: argparse.Namespace) -> int:
    done = {s["section"]: s for s in load(args.out)["sections"]}
    entry = done.get(args.name)
    if entry is None:
        if args.skip_reason:
            outcome = Outcome(section=args.name, status="SKIP", reason=args.skip_reason, timeout_s=args.timeout)
        elif args.rc in (124, 137):
            outcome = Outcome(
                section=args.name,
                status="FAIL",
                seconds=args.timeout or 0.0,
                timeout_s=args.timeout,
                reason=f"timed out after {args.timeout:.0f} s (the section's limit); see the log",
            )
        else:
            outcome = Outcome(
                section=args.name,
                status="FAIL",
                timeout_s=args.timeout,
                reason=f"its process exited with status {args.rc} before recording an outcome; see the log",
            )
        record(args.out, outcome)
    else:
        outcome = Outcome.from_json(entry)
    print(verdict_line(outcome), flush=True)
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    body = load(args.out)
    print("== summary")
    for s in body["sections"]:
        print("  " + verdict_line(Outcome.from_json(s)))
    print(summary_line(body, dry_run=args.dry_run))
    skipped = [x["section"] for x in body["sections"] if x["status"] == "SKIP"]
    if skipped and not args.dry_run:
        print(f"note: nothing is proven for {', '.join(skipped)} (skipped: see each reason)")
    print(f"results: {args.out / 'results.json'}")
    return 1 if body.get("summary", {}).get("FAIL", 0) else 0


def _cmd_promote(args: argparse.Namespace) -> int:
    from sdcguard.golden.candidates import promote, read_candidates

    candidates = [c for path in args.files for c in read_candidates(path)]
    for path in promote(candidates, args.golden_dir):
        print(f"recorded {path}")
    print("commit golden_vectors/ (manifest.json and the new files)")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    out_default = Path(os.environ.get("OUT") or _ROOT / "gpu_check_out")

    def with_out(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--out", type=Path, default=out_default, help="results folder (default $OUT, else gpu_check_out/)"
        )
        return p

    p = with_out(sub.add_parser("begin"))
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("plan")
    p.add_argument("--only", default=None, help="comma-separated section names")
    p = with_out(sub.add_parser("run"))
    p.add_argument("name")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--device", type=int, default=0, help="CUDA ordinal for single-GPU steps (default 0)")
    p = with_out(sub.add_parser("finish"))
    p.add_argument("name")
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--skip-reason", default=None)
    p = with_out(sub.add_parser("summary"))
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("promote")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--golden-dir", type=Path, default=None, help="default: the golden_vectors/ sdcguard uses")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {
        "begin": _cmd_begin,
        "plan": _cmd_plan,
        "run": _cmd_run,
        "finish": _cmd_finish,
        "summary": _cmd_summary,
        "promote": _cmd_promote,
    }
    try:
        if getattr(args, "name", None) is not None and args.command in ("run", "finish"):
            section_by_name(args.name)
        return commands[args.command](args)
    except KeyError as e:
        print(f"gpu_check: {e.args[0]}", file=sys.stderr)
        return 2
    except Exception as e:
        from sdcguard.errors import SdcguardError

        if isinstance(e, (SdcguardError, ValueError, OSError)):
            print(f"gpu_check: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
