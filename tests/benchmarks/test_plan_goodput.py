"""``benchmarks/plan_goodput.py`` fills a store, plans from it and prints the three intervals' goodput side by side."""

from __future__ import annotations

import re

from tests._bench import run_benchmark


def test_it_prints_the_three_plans_side_by_side() -> None:
    p = run_benchmark("plan_goodput.py", "--fleet", "512", "--devices", "256", "--days", "5", "--repeats", "2")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = {
        m[1]: m
        for m in re.finditer(r"^\s*(fixed|fleet average|allocation): interval .* goodput (0\.\d+)", p.stdout, re.M)
    }
    assert set(lines) == {"fixed", "fleet average", "allocation"}, p.stdout
    assert "(x1.0000 of the allocation's plan)" in p.stdout and "a job of 256" in p.stdout
