"""The slowness statistic's arithmetic at fleet scale: :func:`sdcguard.fleet.slow.judge_slow` over one record per
(device, case), what the report hands it from the store's case tallies, for fleets of ``--devices`` sizes.

A synthetic fleet, the same for every tree and run: the suite's 31 cases in 6 kernel families, every device with
20-40 executions of each, ``--models`` peer groups (models) of equal size, one device in 1,000 half again as slow,
every time jittered by 5%. Only the statistic is timed (the records are built before the clock starts); the store's
query that feeds it in the report is measured by ``report_scale.py``.

``--base COMMIT`` times that commit's ``judge_slow`` too (a git worktree in a temporary directory), alternately with
this tree's, ``--pairs`` times each, so machine noise hits both alike, and prints the ratio this/base per size (the
median over the pairs) and whether both gave the same verdicts::

    python benchmarks/slow_scale.py --devices 10000 30000 100000 --base 6408131 --pairs 3
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(root: str, devices: int, models: int) -> dict[str, object]:
    """One timing of ``judge_slow`` as the tree at ``root`` has it (run in a fresh interpreter)."""
    sys.path.insert(0, root)
    from sdcguard.fleet.slow import judge_slow
    from sdcguard.fleet.store.rows import CaseTimes

    rng = random.Random(0)
    cases = [f"case{c:02d}" for c in range(31)]
    family = {c: f"family{i % 6}" for i, c in enumerate(cases)}
    rows = []
    for d in range(devices):
        speed = 1.5 if d % 1000 == 7 else 1.0
        for c in cases:
            n = rng.randint(20, 40)
            rows.append((f"sim:{d:06d}", c, family[c], n, n * 0.01 * speed * rng.uniform(0.95, 1.05)))
    times = CaseTimes.from_rows(rows, scan=0)
    groups = {f"sim:{d:06d}": f"gpu|model{d % models}" for d in range(devices)}
    start = time.perf_counter()
    verdicts = judge_slow(times, groups, history=[])
    seconds = time.perf_counter() - start
    slow = sorted(d for d, v in verdicts.items() if v.slow)
    return {"seconds": seconds, "slow": len(slow), "digest": hash((tuple(slow), repr(sorted(verdicts.items()))))}


def _run(root: Path, devices: int, models: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(root), "--devices", str(devices), "--models", str(models)],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "PATH": ""},
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--models", type=int, default=4, help="peer groups (models) the devices are spread over")
    ap.add_argument("--base", default=None, help="a commit to time side by side with this tree")
    ap.add_argument("--pairs", type=int, default=3, help="runs of each tree per size")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(_child(a.child, a.devices[0], a.models)))
        return
    if a.pairs < 1 or a.models < 1 or min(a.devices) < a.models:
        ap.error("--pairs and --models must be >= 1, every --devices at least --models")
    tmp = Path(tempfile.mkdtemp(prefix="sdcguard-slow-scale-"))
    try:
        base = None
        if a.base is not None:
            base = tmp / "base"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), a.base], check=True)
        print(f"judge_slow over 31 cases per device, {a.models} models; {a.pairs} run(s) per tree and size")
        for n in a.devices:
            mine, theirs, same = [], [], True
            for _ in range(a.pairs):
                if base is not None:
                    b = _run(base, n, a.models)
                    theirs.append(float(b["seconds"]))  # type: ignore[arg-type]
                r = _run(ROOT, n, a.models)
                mine.append(float(r["seconds"]))  # type: ignore[arg-type]
                same = same and (base is None or b["digest"] == r["digest"])
            line = f"{n:>7} devices: this tree {min(mine):.2f}-{max(mine):.2f} s ({r['slow']} slow)"
            if theirs:
                ratio = statistics.median(m / t for m, t in zip(mine, theirs))
                line += f"; {a.base} {min(theirs):.2f}-{max(theirs):.2f} s; this/base {ratio:.2f}"
                line += "; the same verdicts" if same else "; DIFFERENT VERDICTS"
            print(line, flush=True)
    finally:
        if a.base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "base")], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
