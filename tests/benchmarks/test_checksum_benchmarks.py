"""The checksum benchmarks run and derive what they say: ``benchmarks/checksum_cost.py`` on a small model (a clean
checked step passes, a sign flip of a well-scaled result is caught), and ``benchmarks/detector_costs.py``'s
derivation of the defaults' cost from a checked step's (one in ``checksum_every``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_checksum_cost_runs_and_reports_its_coverage(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "checksum_cost.py"),
            "--rounds",
            "2",
            "--rows",
            "8,32",
            "--samples",
            "2",
            "--d",
            "32",
            "--layers",
            "1",
            "--seq",
            "16",
            "--batch",
            "2",
            "--parts",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=280,
    )
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert set(figures["checked"]) == {"8", "32"}
    assert figures["coverage"]["exponent (top bit)"]["8"] == 1.0  # a top-exponent flip is never under the bound
    assert figures["coverage"]["low mantissa (7-0)"]["32"] == 0.0  # and the lowest bits always are
    assert all(v > 0 for v in figures["parts_ms"].values()) and len(figures["parts_ms"]) == 6


def test_detector_costs_derives_the_defaults_from_a_checked_step() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.detector_costs import DEFAULT_CHECKSUM_EVERY, derive_checksums, texts
    finally:
        sys.path.remove(str(ROOT))
    names = ("checks", "peer10", "peer1", "sum1", "shadow1", "megatron", "same_device")
    out: dict[str, Any] = {
        "step": {n: (0.0, 0.0, 0.0) for n in names},
        "own": dict.fromkeys(names, 0.0),
        "derived_50": {"step": 0.02, "own": 0.03},
        "hash_share_per_check": 0.01,
    }
    out["step"]["checks"] = (0.01, 0.0, 0.02)
    out["step"]["sum1"] = (0.01 + 0.15, 0.1, 0.2)  # a checked step: +15% over the same guard without checksums
    measured = {k: dict(v) if isinstance(v, dict) else v for k, v in out.items()}
    derived = derive_checksums(out)
    assert out == measured  # derived, not written into what was measured
    out.update(derived)
    text = texts(out, workers=2)
    assert out["checksum_step"]["step"] == pytest.approx(0.15)
    assert out["derived_defaults"]["step"] == pytest.approx(0.02 + 0.15 / DEFAULT_CHECKSUM_EVERY)
    assert out["derived_checksum1"]["step"] == pytest.approx(0.17)
    assert f"`checksum_every={DEFAULT_CHECKSUM_EVERY}`" in text["defaults"]
    # the matmuls a checked step covered, as the campaign's cost cells say them: checked, unverifiable, run
    out["matmuls"] = {"sum1": [70, 5, 75]}
    text = texts(out, workers=2)
    assert "of 75 matmuls a step, 70 checked, 5 unverifiable" in text["defaults"] and "70 checked" in text["checksum1"]
