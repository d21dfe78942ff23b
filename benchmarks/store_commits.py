"""The store's figures on two commits, side by side in one run: does a change of the store cost anything?

Runs ``benchmarks/store_ingest.py`` and ``benchmarks/report_scale.py`` (with the options given to each) alternately on a
checkout of ``--base`` and on this working tree, ``--pairs`` times each (base, this, this, base, base, ...), so the
machine's noise hits both alike and neither always runs first, and prints every figure the two print (the ingest's
results per second, each timed row of ``report_scale.py``: merges, reports, the HTML page, the policy, the CLI's runs)
as the median over the pairs with its range, base beside new, and their ratio. Each tree runs its own scripts: the
store's API is the commit's (a benchmark calls it), so the instrument is the tree's. The base checkout is a git worktree
in a temporary directory. Run::

    python benchmarks/store_commits.py --base main --pairs 2 \\
        --ingest "--writers 20 --scans 5" --scale "--devices 1000 --days 40 --merge-days 7"
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_TIMED = re.compile(r"^(?P<label>\S.*?)\s{2,}(?P<wall>\d+\.\d+)s\s+(?P<cpu>\d+\.\d+)s")
"""A timed row of ``report_scale.py``: its label, wall and CPU seconds."""
_INGEST = re.compile(
    r"^(?P<backend>sqlite|postgresql)\s+[\d,]+ results .* in (?P<s>[\d.]+) s: (?P<rate>[\d,]+) results/s"
)
_FRESH = re.compile(
    r"a finished scan in the report after (?P<inproc>[\d.]+) s in-process, (?P<cli>[\d.]+) s by the CLI"
)
_CLI = re.compile(r"^sdcguard report --format json \(CLI, (?P<window>[^;]+);.*?3 runs: (?P<runs>.*?); --computed")
_RUN = re.compile(r"(\d+\.\d+) s \(")
_RECORDED = re.compile(r"recorded in (?P<s>[\d.]+) s on")
_CARRIED = re.compile(
    r"recorded into the fleet store in (?P<s>[\d.]+) s, of which prune .* every day (?P<prune>[\d.]+) s"
)
_REFRESH = re.compile(r"^sdcguard db refresh of the \d+ windows: (?P<s>[\d.]+) s")


def figures(output: str) -> dict[str, float]:
    """``figure -> value`` of one run's output: seconds, or results per second (the ingest's rate; higher is
    better). The report's CLI runs give their median."""
    out: dict[str, float] = {}
    backend = None
    for line in output.splitlines():
        if m := _INGEST.match(line):
            backend = m["backend"]
            out[f"ingest {backend}: results/s"] = float(m["rate"].replace(",", ""))
        elif (m := _FRESH.search(line)) and backend is not None:
            out[f"ingest {backend}: a finished scan in the report, in-process (s)"] = float(m["inproc"])
            out[f"ingest {backend}: a finished scan in the report, CLI (s)"] = float(m["cli"])
        elif m := _RECORDED.search(line):
            out["node stores' scans recorded (s)"] = float(m["s"])
        elif m := _CARRIED.search(line):
            out["later days recorded into the fleet store, prune included (s)"] = float(m["s"])
            out["  of which prune (s)"] = float(m["prune"])
        elif m := _REFRESH.match(line):
            out["sdcguard db refresh (s)"] = float(m["s"])
        elif m := _CLI.match(line):
            runs = [float(x) for x in _RUN.findall(m["runs"])]
            out[f"CLI report, {m['window']} (median of 3 runs, s)"] = statistics.median(runs)
        elif m := _TIMED.match(line.strip()):
            label = re.sub(r"\s*\([\d,]+ (rows|result rows)\)", "", m["label"].strip())
            out[f"{label} (wall s)"] = float(m["wall"])
    return out


def _run(tree: Path, script: str, options: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / script), *options], cwd=tree, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed in {tree}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def _measure(tree: Path, scripts: list[tuple[str, list[str]]]) -> dict[str, float]:
    found: dict[str, float] = {}
    for script, options in scripts:
        found.update(figures(_run(tree, script, options)))
    return found


def _row(name: str, base: list[float], new: list[float]) -> str:
    b, n = statistics.median(base), statistics.median(new)
    ratio = f"{n / b:6.3f}x" if b else "   -   "
    spread = f"[{min(base):.3f}, {max(base):.3f}]  {n:10.3f} [{min(new):.3f}, {max(new):.3f}]"
    return f"  {name:<62} {b:10.3f} {spread}  {ratio}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (a revision git knows)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--ingest", default="--writers 20 --scans 5", help="options of store_ingest.py")
    parser.add_argument("--scale", default="--devices 1000 --days 40 --merge-days 7", help="options of report_scale.py")
    args = parser.parse_args()
    scripts = [("store_ingest.py", shlex.split(args.ingest)), ("report_scale.py", shlex.split(args.scale))]
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True, capture_output=True
        )
        try:
            runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
            for i in range(args.pairs):
                # each pair in the other order: neither tree always runs first (after the other's files and load)
                for key, tree in (("base", base_tree), ("new", ROOT))[:: 1 if i % 2 == 0 else -1]:
                    runs[key].append(_measure(tree, scripts))
                print(f"pair {i + 1}/{args.pairs} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
    print(f"this tree beside {args.base}, median of {args.pairs} alternating pairs [min, max], then new / base")
    for script, options in scripts:
        print(f"  {script} {' '.join(options)}")
    print(f"  {'figure':<62} {'base':>10} {'':17}  {'new':>10} {'':17}  ratio")
    for name in runs["base"][0]:
        base = [r[name] for r in runs["base"] if name in r]
        new = [r[name] for r in runs["new"] if name in r]
        if len(base) == len(new) == args.pairs:
            print(_row(name, base, new))


if __name__ == "__main__":
    main()
