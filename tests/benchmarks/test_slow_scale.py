"""``benchmarks/slow_scale.py`` runs and prints a line per size; bad sizes are one line and exit 2."""

from __future__ import annotations

from tests._bench import run_benchmark


def test_it_times_the_statistic_per_size_and_finds_the_slow_device() -> None:
    p = run_benchmark("slow_scale.py", "--devices", "1100", "--models", "2", "--pairs", "1")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "   1100 devices: this tree" in p.stdout and "(2 slow)" in p.stdout  # devices 7 and 1007, 1.5x slower


def test_fewer_devices_than_models_is_refused_in_one_line() -> None:
    p = run_benchmark("slow_scale.py", "--devices", "3", "--models", "4")
    assert p.returncode == 2 and "at least --models" in p.stderr.strip().splitlines()[-1]


def test_kept_verdicts_are_timed_and_come_back_the_same() -> None:
    p = run_benchmark("slow_scale.py", "--devices", "1100", "--models", "2", "--pairs", "1", "--kept")
    assert p.returncode == 0, p.stderr[-2000:]
    kept = [line for line in p.stdout.splitlines() if "verdicts kept in" in line]
    assert len(kept) == 1 and kept[0].endswith("the same verdicts") and "read back in" in kept[0], p.stdout
