"""Helpers for tests that run the real scanner (``python -m sdcguard scan``) in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("SDCGUARD_DB", None)
    e.pop("SDCGUARD_ACTIONS", None)
    e.pop("SDCGUARD_CONFIG", None)
    return e


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


_PROBE = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import numpy as np
a = np.random.default_rng(0).standard_normal((160, 160)).astype(np.float32)
x = np.arange(1 << 16, dtype=np.uint32)
def work():
    b, y = a, x
    for _ in range(8):
        b = np.tanh(b @ a * 0.01)
        y = (y * np.uint32(2654435761)) ^ (y >> np.uint32(7))
    return float(b.sum()) + int(y[-1])
work()
t0 = time.thread_time()
for _ in range(200):
    work()
print(time.thread_time() - t0)
"""


def core_speeds(rounds: int = 3) -> tuple[int, int, float]:
    """(slower core, faster core, ratio): the first two cores' thread CPU time for the same numpy work (matmuls,
    integer hashing), run on both at once as a scan runs them; the median of ``rounds`` runs (about 0.8 s each).

    Two vCPUs of a shared VM need not be equal devices: CI measured one 1.39x the other. Tests that compare two
    cores ask this first."""
    first, second = cores()[:2]
    e = {**env(), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    ratios = []
    for _ in range(rounds):
        procs = [
            subprocess.Popen([sys.executable, "-c", _PROBE, str(c)], stdout=subprocess.PIPE, text=True, env=e)
            for c in (first, second)
        ]
        t_first, t_second = (float(p.communicate(timeout=60)[0]) for p in procs)
        ratios.append(t_second / t_first)
    ratio = sorted(ratios)[len(ratios) // 2]
    return (second, first, ratio) if ratio >= 1.0 else (first, second, 1.0 / ratio)


def sdcguard(db: Path, *args: str, timeout: float = 120, module: str = "sdcguard") -> subprocess.CompletedProcess[str]:
    """Run ``python -m sdcguard --db DB ARGS`` (or ``python -m fleet_scan --db DB ARGS``)."""
    return subprocess.run(
        [sys.executable, "-m", module, "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )


def scan(
    db: Path, lock_dir: Path, *args: str, budget: float = 1.5, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """A scan of this machine's CPU cores with a short budget, busy or not (tests must not depend on load)."""
    return sdcguard(
        db, "scan", "--all", "--json", "--budget", str(budget), "--lock-dir", str(lock_dir), *args, timeout=timeout
    )


def events(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def report(db: Path) -> dict[str, dict[str, Any]]:
    proc = sdcguard(db, "report", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return {row["device"]: row for row in json.loads(proc.stdout)}


def argv_recorder(tmp: Path) -> tuple[str, Path]:
    """An action template running a script that appends its argv (JSON) to a log; (template, log path)."""
    script = tmp / "record_argv.py"
    log = tmp / "argv.log"
    script.write_text(
        "import json, sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(json.dumps(sys.argv[2:]) + '\\n')\n"
    )
    return f"{sys.executable} {script} {log} {{device}} {{host}} {{reason}}", log


def tampered_golden(tmp: Path) -> Path:
    """A copy of the golden data with one byte of one golden file flipped (its manifest unchanged)."""
    src = ROOT / "golden_vectors"
    dst = tmp / "golden_vectors"
    shutil.copytree(src, dst)
    victim = sorted(p for p in dst.rglob("*.bin"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    return dst


def store_rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def resigned_golden(tmp: Path, case_id: str = "memory.u32.moving_inversions") -> Path:
    """A copy of the golden data where one stored row of ``case_id`` is changed and the manifest re-signed
    (the file's sha256 and the manifest's own): every hash matches, only the reference arithmetic can tell."""
    import hashlib

    src = ROOT / "golden_vectors"
    dst = tmp / "golden_vectors"
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    entry = next(c for c in manifest["cases"] if c["id"] == case_id)
    victim = dst / entry["file"]
    data = bytearray(victim.read_bytes())
    data[8] ^= 0x01
    victim.write_bytes(bytes(data))
    manifest["files"][entry["file"]] = hashlib.sha256(bytes(data)).hexdigest()
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}

    def canonical(obj: Any) -> bytes:
        return (json.dumps(obj, sort_keys=True, indent=1, separators=(",", ": ")) + "\n").encode()

    manifest["manifest_sha256"] = hashlib.sha256(canonical(body)).hexdigest()
    (dst / "manifest.json").write_bytes(canonical(manifest))
    return dst
