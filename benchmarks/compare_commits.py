"""The same benchmark on two commits, side by side in one run: does a change cost the guard's hot path anything?

Runs ``benchmarks/replay_overhead.py`` (with the options after ``--``) alternately on a checkout of ``--base`` and on
``--new`` (default: this working tree), ``--pairs`` times each (base, this, base, this, ...), so machine noise hits both
alike, and prints per configuration the ratio this/base of the time spent inside the guard's own calls (``end_step`` and
``after_optimizer_step`` on worker 0) and of the step, as the median over the pairs with its range. The base checkout
(and a ``--new`` one) is a git worktree in a temporary directory with its C engines built in place, so both trees run
the same compiled code paths; the instrument (the benchmark script and its model, ``sdcguard/testing``) is this tree's
on both sides. Run::

    python benchmarks/compare_commits.py --base d836e33 --pairs 3 -- --rounds 3 --steps 10 --only peer sum1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _build_in_place(tree: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "build_ext", "--inplace", "-q"],
        cwd=tree,
        check=True,
        capture_output=True,
    )


def _run(tree: Path, options: list[str], out: Path) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, str(tree / "benchmarks" / "replay_overhead.py"), *options, "--json", str(out)],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def _ratios(pairs: list[tuple[dict[str, Any], dict[str, Any]]], key: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for base, new in pairs:
        for name, value in new[key].items():
            old = base[key].get(name)
            if key == "times":
                value, old = statistics.median(value), statistics.median(old) if old else None
            if old:
                out.setdefault(name, []).append(value / old)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (a revision git knows)")
    parser.add_argument("--new", default=None, help="the commit to measure (default: this working tree)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("options", nargs=argparse.REMAINDER, help="-- then options of replay_overhead.py")
    args = parser.parse_args()
    options = args.options[1:] if args.options[:1] == ["--"] else args.options
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": args.base, "new": args.new}
        paths = {k: Path(tmp) / k if rev is not None else ROOT for k, rev in trees.items()}
        try:
            for key, rev in trees.items():
                if rev is None:
                    continue
                subprocess.run(
                    ["git", "worktree", "add", "--detach", str(paths[key]), rev],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                )
                # The instrument is this tree's: the same benchmark script and model on both sides (a commit's
                # library is what is measured; sdcguard/testing is outside its import graph).
                shutil.copy2(
                    ROOT / "benchmarks" / "replay_overhead.py", paths[key] / "benchmarks" / "replay_overhead.py"
                )
                shutil.copytree(ROOT / "sdcguard" / "testing", paths[key] / "sdcguard" / "testing", dirs_exist_ok=True)
            for path in paths.values():
                _build_in_place(path)
            pairs = []
            for i in range(args.pairs):
                old = _run(paths["base"], options, Path(tmp) / f"base{i}.json")
                new = _run(paths["new"], options, Path(tmp) / f"new{i}.json")
                pairs.append((old, new))
                print(f"pair {i + 1}/{args.pairs} done", file=sys.stderr, flush=True)
        finally:
            for key, rev in trees.items():
                if rev is not None:
                    subprocess.run(
                        ["git", "worktree", "remove", "--force", str(paths[key])], cwd=ROOT, capture_output=True
                    )
    ran = " ".join(options)
    new = args.new or "this tree"
    print(f"{new} / {args.base}, median of {args.pairs} alternating pairs [min, max]; replay_overhead.py {ran}")
    for key, what in (("inside", "time inside the guard's calls"), ("times", "step time")):
        print(what + ":")
        for name, rs in _ratios(pairs, key).items():
            print(f"  {name:<12} {statistics.median(rs):6.3f}x  [{min(rs):.3f}, {max(rs):.3f}]")


if __name__ == "__main__":
    main()
