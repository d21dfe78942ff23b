"""Section ``gpu-tests``: the test suite's own GPU tests (``pytest -m gpu``), which CI always skips.

They add what the other sections do not: an injected flip located on its SM for every kernel family, a cuBLAS
failure's row and column, a march over a share of memory, the fault injector's plan written with torch indexing
on CUDA tensors, and cupy arrays and CUDA tensors fingerprinted like the host. On a GPU machine a skipped GPU test
is a failure: it means the test's own gate (cupy, the driver, torch's CUDA) said no.
"""

from __future__ import annotations

import re
from pathlib import Path

from .context import Context, run_command
from .results import SectionReport

__all__ = ["run", "TEST_FILES", "counts"]

_ROOT = Path(__file__).resolve().parents[2]
TEST_FILES = (
    "tests/golden/test_golden_gpu.py",
    "tests/inject/test_inject_torch_gpu.py",
    "tests/fingerprints/test_fingerprint.py",
)


def counts(summary: str) -> dict[str, int]:
    """``{"passed": 12, "skipped": 1, ...}`` from pytest's last line (``12 passed, 1 skipped in 3.2s``)."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}


def _pytest(*args: str, timeout: float) -> tuple[int, str]:
    rc, out, err = run_command(
        [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(_ROOT),
            "-m",
            "gpu",
            *args,
            *(str(_ROOT / f) for f in TEST_FILES),
        ],
        timeout=timeout,
    )
    return rc, out + err


def run(ctx: Context, rep: SectionReport) -> str:
    rc, out = _pytest("--collect-only", timeout=ctx.left())
    found = re.search(r"(\d+)(?:/\d+)? tests? collected", out)
    tail = out.strip().splitlines()[-1] if out.strip() else f"exit {rc}"
    rep.check(
        "the GPU tests are collected",
        rc == 0 and found is not None and int(found.group(1)) > 0,
        found.group(0) if found else tail,
    )
    ctx.require_gpu(f"run pytest -m gpu on {', '.join(TEST_FILES)}")
    rc, out = _pytest("-rs", timeout=ctx.left())
    lines = out.strip().splitlines()
    last = lines[-1] if lines else ""
    n = rep.measure("pytest", counts(last))
    rep.check("pytest -m gpu passes", rc == 0, last)
    skipped = [line for line in lines if line.startswith("SKIPPED")]
    rep.check("no GPU test is skipped on a GPU machine", not n.get("skipped"), "; ".join(skipped[:3]))
    for line in lines:
        if line.startswith(("FAILED", "ERROR")):
            rep.say(f"  {line}")
    return f"{n.get('passed', 0)} GPU tests passed"
