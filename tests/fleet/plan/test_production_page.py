"""docs/production.md's table of settings by width is the planning model's output at the settings it states: each
row recomputed from ``sdcguard.fleet.plan`` (a change to the model's constants that moves a figure fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from sdcguard.fleet.plan.cadence import cadence
from sdcguard.fleet.plan.intervals import RecoveryCost, daly, goodput, goodput_with_recovery

PAGE = Path(__file__).resolve().parents[3] / "docs" / "production.md"
C, RESTART, STEP, RECOVERY = 60.0, 600.0, 1.0, 30.0
WIDTHS = {"1,024": (7.9, 160.0), "16,384": (1.8, 10.0)}
"""Width -> (hours between loud interruptions, days between SDC events), as the page states them."""


def test_every_row_is_the_models_output() -> None:
    rows = re.findall(r"^\| ([\d,]+) devices \| .*?`R=(\d+), K=(\d+)`\)? \| (.*) \|$", PAGE.read_text(), re.M)
    assert len(rows) == 6
    for width, r, k, rest in rows:
        loud_h, sdc_days = WIDTHS[width]
        loud, sdc = 1 / (loud_h * 3600), 1 / (sdc_days * 86400)
        c = cadence(int(r), int(k))
        interval, lost = daly(C, 1 / (loud + sdc)), (c.sticky_mean_steps + int(r) / 2) * STEP
        restart = goodput(interval, C, RESTART, 1 / (loud + sdc))
        cost = RecoveryCost(lost_s=lost, recovery_s=RECOVERY)
        recover = goodput_with_recovery(
            daly(C, 1 / loud), C, RESTART, loud_per_s=loud, recoverable_per_s=sdc, cost=cost
        )
        expected = [
            f"{c.overhead:.1%}",
            f"{c.one_off_caught:.1%}",
            f"{c.sticky_mean_steps:.1f}",
            f"{interval / 60:.1f} min",
            f"{restart / (1 + c.overhead):.3f}",
            f"{recover / (1 + c.overhead):.3f}",
            f"{restart:.3f}",
        ]
        assert [cell.strip() for cell in rest.split("|")] == expected, (width, r, k)
