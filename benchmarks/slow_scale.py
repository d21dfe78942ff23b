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

``--kept [DB]`` also keeps this tree's verdicts in a store (``sdcguard.fleet.slow_fleet.keep_verdicts``, what
``sdcguard db refresh`` does) and reads them back three times (``kept_verdicts``, what a report reads instead of
computing them), timed, with whether they came back equal::

    python benchmarks/slow_scale.py --devices 10000 100000 --pairs 1 --kept
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _child(root: str, devices: int, models: int, kept: str | None = None) -> dict[str, object]:
    """One timing of ``judge_slow`` as the tree at ``root`` has it (run in a fresh interpreter); with ``kept`` (a
    store: a file path or a server's URL), also the time to keep the verdicts there and to read them back."""
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
    out: dict[str, object] = {
        "seconds": seconds,
        "slow": len(slow),
        "digest": hash((tuple(slow), repr(sorted(verdicts.items())))),
    }
    if kept is not None:
        out.update(_kept(kept, verdicts))
    return out


def _kept(db: str, verdicts: dict[str, Any]) -> dict[str, object]:
    """Keep ``verdicts`` in the store ``db`` and read them back three times: the seconds of each, and whether they
    came back equal (``sdcguard.fleet.slow_fleet``: what ``db refresh`` writes and a report reads)."""
    import dataclasses

    from sdcguard.durations import DEFAULT_WINDOW_S
    from sdcguard.fleet.slow_fleet import keep_verdicts, kept_verdicts
    from sdcguard.fleet.store.store import Store

    now = time.time()
    since = now - DEFAULT_WINDOW_S  # the report's default window
    with Store.open(db) as store:
        start = time.perf_counter()
        keep_verdicts(store, verdicts, since=since, now=now)
        keep_s = time.perf_counter() - start
        reads = []
        for _ in range(3):
            start = time.perf_counter()
            back = kept_verdicts(store, since=since, now=now, max_age_s=3600)
            reads.append(time.perf_counter() - start)
        size = len(json.dumps(store.summaries.kept(f"slowness.{round(DEFAULT_WINDOW_S)}")))  # its summary
    same = back is not None and {d: dataclasses.replace(v, judged_at=None) for d, v in back.items()} == verdicts
    return {"keep": keep_s, "reads": reads, "same": same, "mb": size / 1e6}


def _run(root: Path, devices: int, models: int, kept: str | None = None) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(root), "--devices", str(devices), "--models", str(models)]
        + ([] if kept is None else ["--kept", kept]),
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
    ap.add_argument(
        "--kept",
        nargs="?",
        const="",
        default=None,
        metavar="DB",
        help="also keep this tree's verdicts in a store and read them back (timed): DB, a server's postgresql:// URL, "
        "or without DB a new SQLite file",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(_child(a.child, a.devices[0], a.models, a.kept)))
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
                kept = None if a.kept is None else (a.kept or str(tmp / f"kept-{n}-{len(mine)}.db"))
                r = _run(ROOT, n, a.models, kept)
                mine.append(float(r["seconds"]))  # type: ignore[arg-type]
                if kept is not None:
                    reads = r["reads"]
                    print(
                        f"{n:>7} devices: verdicts kept in {r['keep']:.2f} s ({r['mb']:.1f} MB), read back in "
                        + ", ".join(f"{x:.2f}" for x in reads)  # type: ignore[attr-defined]
                        + f" s{', the same verdicts' if r['same'] else ', DIFFERENT VERDICTS'}",
                        flush=True,
                    )
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
