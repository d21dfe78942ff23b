"""``benchmarks/recovery.py`` runs the four ways of going on after a verdict on one small job and prints what it
measured and what the goodput model makes of it; the printed goodput follows from the printed figures (never a
timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdcguard.fleet.plan.intervals import RecoveryCost, goodput_with_recovery
from tests._bench import run_benchmark

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_it_measures_the_four_ways_and_derives_the_goodput_from_them(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    args = ["--workers", "3", "--width", "16", "--every", "1", "--fault", "4", "--steps", "8", "--reps", "3"]
    p = run_benchmark("recovery.py", *args, "--json", str(out), timeout=280)
    assert p.returncode == 0, p.stderr[-3000:]
    figures = json.loads(out.read_text())
    rows, model, rate = figures["rows"], figures["goodput"], figures["rate"]
    assert list(rows) == ["recover, spare", "recover, no spare", "restart, shared memory", "exit + DCP restart"]
    for name, row in rows.items():
        assert row["lost"] >= 1 and row["seconds"] > 0, name
        line = next(x for x in p.stdout.splitlines() if x.startswith(f"goodput, {name} "))
        assert line.endswith(f"{model[name]:.1%}")
    # The model, from the printed figures and the planning model's formulas: today's path is the anchor, the others
    # lose what they measured.
    assert model["exit + DCP restart"] == pytest.approx(0.85)
    share = figures["snapshot_share"]
    for name, recovery_s in [("recover, spare", rows["recover, spare"]["seconds"]),
                             ("restart, shared memory", model["restart_s"])]:  # fmt: skip
        cost = RecoveryCost(lost_s=rows[name]["lost"] * 2.0, recovery_s=recovery_s)
        kept = goodput_with_recovery(model["interval_s"], 60.0, model["restart_s"], loud_per_s=0.0,
                                     recoverable_per_s=rate, cost=cost)  # fmt: skip
        assert model[name] == pytest.approx(kept * (1 - share)), name
    snap = figures["snapshot"]
    assert share == pytest.approx(snap["snapshot_s"] * snap["share"] / snap["step_s"])
    assert f"{share:.2%} of a step" in p.stdout


def test_bad_settings_are_one_line_and_exit_2() -> None:
    p = run_benchmark("recovery.py", "--fault", "9", "--steps", "8")
    assert p.returncode == 2 and "--fault" in p.stderr.strip().splitlines()[-1]
