"""What `sdcguard report` shows: --families in every format, and a plot axis fitted to the window and the data."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.fleet.report.plot import plot_window
from sdcguard.fleet.store.store import Store
from tests._fleet import clean, result, scan

NOW = time.time()


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    t = NOW - 3600
    with Store.open(path) as store:
        scan(
            store,
            "sim:1",
            [*clean("sim:1", 20, t=t), *clean("sim:1", 10, t=t, family="alu"), result("sim:1", passed=False, t=t + 30)],
            t=t,
        )
        scan(store, "sim:2", clean("sim:2", 30, t=t, family="alu"), t=t)
    return path


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_families_in_csv_are_rows_with_a_family_column(db: Path) -> None:
    code, out, err = _run("--db", str(db), "report", "--format", "csv", "--families")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    got = {(r["device"], r["family"]): (int(r["executions"]), int(r["failures"])) for r in rows}
    assert got == {
        ("sim:1", "all"): (31, 1),
        ("sim:1", "gemm"): (21, 1),
        ("sim:1", "alu"): (10, 0),
        ("sim:2", "all"): (30, 0),
        ("sim:2", "alu"): (30, 0),
    }
    code, out, _ = _run("--db", str(db), "report", "--format", "csv")
    assert "family" not in out.splitlines()[0]  # without --families: the columns as before


def test_families_in_the_table_are_rows_under_each_device(db: Path) -> None:
    code, out, err = _run("--db", str(db), "report", "--families")
    assert code == 0, err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "sim:1" in line)
    assert "alu" in lines[at + 1] and "10" in lines[at + 1]
    assert "gemm" in lines[at + 2] and "21" in lines[at + 2]
    code, plain, _ = _run("--db", str(db), "report")
    assert "gemm" not in plain


def test_a_fresh_store_is_plotted_in_minutes_over_its_data_not_a_week() -> None:
    now = 1_800_000_000.0
    w = plot_window(now - 7 * 86400, now - 20, now)  # one 10-second scan, 20 seconds ago; window 7 days
    assert w.unit == "minutes" and w.start == now - 600 and w.width_s == 20
    w = plot_window(now - 1800, now - 7 * 86400, now)  # --since 30m on an old store
    assert w.unit == "minutes" and w.start == now - 1800
    assert plot_window(now - 12 * 3600, now - 7 * 86400, now).unit == "hours"
    assert plot_window(now - 7 * 86400, now - 30 * 86400, now).unit == "days"
    assert plot_window(now - 90, now - 86400, now).start == now - 90  # never before the window asked for


@given(since=st.one_of(st.none(), st.floats(1, 90 * 86400)), first=st.one_of(st.none(), st.floats(0, 90 * 86400)))
def test_the_axis_covers_the_data_in_the_window_with_about_30_bins(since: float | None, first: float | None) -> None:
    now = 1_800_000_000.0
    w = plot_window(None if since is None else now - since, None if first is None else now - first, now)
    span = now - w.start
    assert w.width_s * 30 == pytest.approx(span)
    if since is not None:
        assert w.start >= now - since - 1e-6  # nothing from before the window
    if first is not None and (since is None or first <= since):
        assert w.start <= now - first + 1e-6  # every execution of the window is on the axis
    assert span / w.unit_s <= 120  # at most 120 of its units: 2 hours in minutes, 2 days in hours


def test_report_plot_of_a_fresh_store_writes_a_png(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    with Store.open(db) as store:
        scan(store, "sim:1", clean("sim:1", 5, t=time.time() - 20), t=time.time() - 20)
    png = tmp_path / "rates.png"
    code, _, err = _run("--db", str(db), "report", "--plot", str(png), "--since", "30m")
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_row_has_the_devices_local_index(tmp_path: Path) -> None:
    """``index`` (the Prometheus ``gpu`` label): a GPU's as the store keeps it, else a CPU core's or a simulated
    device's number from its id; None for a GPU whose index was never recorded."""
    from sdcguard.fleet.report.devices import build_report
    from sdcguard.records import DeviceInfo

    gpu = "GPU-8f2b6c1e-0000-4000-8000-000000000001"
    other = "GPU-8f2b6c1e-0000-4000-8000-000000000002"
    with Store.open(tmp_path / "f.db") as store:
        store.scans.record_devices(
            [
                DeviceInfo(id="cpu:node-7:13", host="node-7", kind="cpu"),
                DeviceInfo(id="sim:120", host="h", kind="sim"),
                DeviceInfo(id=gpu, host="node-7", kind="gpu", index=5),
                DeviceInfo(id=other, host="node-7", kind="gpu"),
            ],
            now=time.time(),
        )
        rows = {r.device: r.index for r in build_report(store, since=None)}
    assert rows == {"cpu:node-7:13": 13, "sim:120": 120, gpu: 5, other: None}
