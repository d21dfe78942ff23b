"""The store-backed commands as a user runs them: report, quarantine, incidents, merge, export prometheus."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo, Incident
from tests._fleet import clean, result, scan, snapshot

ROOT = Path(__file__).resolve().parents[2]
NOW_ISH = __import__("time").time()


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    t = NOW_ISH - 3600
    with Store.open(path) as store:
        scan(store, "sim:1", [*clean("sim:1", 20, t=t), result("sim:1", passed=False, t=t + 30)], t=t)
        scan(store, "sim:2", clean("sim:2", 30, t=t, family="alu"), t=t)
        scan(store, "sim:3", clean("sim:3", 5, t=t), t=t)
        store.quarantine.add("sim:3", reason="MCE", by="alice@ops")
        store.training.record_incident(
            Incident(
                kind="replay",
                step=12,
                suspect_ranks=(1,),
                device="sim:1",
                detail="local grads differ",
                devices=("sim:1",),
                hosts=("node1",),
            )
        )
    return path


def test_report_json_has_the_design_fields(db: Path) -> None:
    code, out, _ = _run("--db", str(db), "report", "--format", "json", "--families")
    assert code == 0
    rows = {r["device"]: r for r in json.loads(out)}
    assert set(rows) == {"sim:1", "sim:2", "sim:3"}
    for r in rows.values():
        assert {
            "device",
            "host",
            "kind",
            "executions",
            "failures",
            "rate",
            "rate_low",
            "rate_high",
            "status",
            "last_scan",
        } <= set(r)
        assert r["rate_low"] <= r["rate"] <= r["rate_high"]
    assert (rows["sim:1"]["executions"], rows["sim:1"]["failures"], rows["sim:1"]["status"]) == (21, 1, "suspect")
    assert rows["sim:2"]["status"] == "healthy" and rows["sim:2"]["families"]["alu"]["executions"] == 30
    assert rows["sim:3"]["status"] == "quarantined"
    assert rows["sim:1"]["host"] == "node1" and rows["sim:1"]["kind"] == "sim"
    assert rows["sim:1"]["last_scan"].endswith("Z")


def test_report_csv_table_device_and_window(db: Path) -> None:
    code, out, _ = _run("--db", str(db), "report", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["device"] for r in rows} == {"sim:1", "sim:2", "sim:3"}
    code, out, _ = _run("--db", str(db), "report", "--device", "sim:2", "--format", "json")
    (only,) = json.loads(out)
    assert only["device"] == "sim:2" and "families" not in only and only["executions"] == 30
    code, out, _ = _run("--db", str(db), "report", "--since", "10m", "--format", "json")
    assert all(r["executions"] == 0 for r in json.loads(out))  # everything is an hour old
    code, out, _ = _run("--db", str(db), "report")
    assert code == 0 and "sim:1" in out and "quarantined" in out


def test_report_plot_writes_a_png(db: Path, tmp_path: Path) -> None:
    png = tmp_path / "rates.png"
    code, _, err = _run("--db", str(db), "report", "--plot", str(png), "--format", "json")
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "--since", "banana"], "not a duration"),
        (["report", "--device", "sim:99"], "is not a device this store has seen"),
        (["quarantine", "release", "sim:99", "--reason", "x"], "not a device this store has seen"),
        (["quarantine", "release", "sim:2", "--reason", "x"], "not quarantined"),
        (["quarantine", "add", "sim:3", "--reason", "x"], "already quarantined"),
        (["quarantine", "add", "banana", "--reason", "x"], "not a device id"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_the_store_is_unchanged(db: Path, args: list[str], message: str) -> None:
    before = snapshot(db)
    code, out, err = _run("--db", str(db), *args)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert snapshot(db) == before


@pytest.mark.parametrize("kind", ["text", "missing_dir", "future", "missing_file"])
def test_bad_store_paths_from_a_real_shell(tmp_path: Path, kind: str) -> None:
    """As a new user would: a subprocess, one line on stderr, exit 2, nothing changed or created."""
    if kind == "text":
        path = tmp_path / "notes.txt"
        path.write_text("hello\n" * 50)
    elif kind == "missing_dir":
        path = tmp_path / "nope" / "fleet.db"
    elif kind == "missing_file":
        path = tmp_path / "fleet.db"
    else:
        path = tmp_path / "future.db"
        Store.open(path).close()
        import sqlite3

        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 99")
        conn.commit()
        conn.close()
    before = snapshot(path) if path.exists() else None
    listing = sorted(p.name for p in tmp_path.iterdir())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "sdcguard", "--db", str(path), "report"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stdout == "" and p.stderr.count("\n") == 1 and p.stderr.startswith("sdcguard: error: ")
    assert (snapshot(path) if path.exists() else None) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == listing


def test_quarantine_add_list_release_history_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    # a device no scan recorded (a fresh store): only with --new
    assert _run("--db", str(db), "quarantine", "add", "cpu:node7:3", "--reason", "MCE in dmesg", "--new")[0] == 0
    code, out, _ = _run("--db", str(db), "quarantine", "list", "--format", "json")
    (row,) = json.loads(out)
    assert (row["device"], row["state"], row["reason"], row["host"]) == (
        "cpu:node7:3",
        "quarantined",
        "MCE in dmesg",
        "node7",
    )
    assert _run("--db", str(db), "quarantine", "release", "cpu:node7:3", "--reason", "core disabled")[0] == 0
    (row,) = json.loads(_run("--db", str(db), "quarantine", "list", "--format", "json")[1])
    assert row["state"] == "probation"
    hist = json.loads(_run("--db", str(db), "quarantine", "history", "--format", "json")[1])
    assert [(h["action"], h["reason"]) for h in hist] == [("quarantine", "MCE in dmesg"), ("release", "core disabled")]
    assert all(h["by"] and h["time"] for h in hist)
    code, out, _ = _run("--db", str(db), "quarantine", "list")
    assert code == 0 and "probation" in out


def test_a_typo_quarantines_nothing_and_suggests_the_near_device(db: Path) -> None:
    before = snapshot(db)
    code, _, err = _run("--db", str(db), "quarantine", "add", "sim:33", "--reason", "typo of sim:3")
    assert code == 2 and err.count("\n") == 1, err
    assert "sim:33 is not a device this store has seen" in err and "sim:3" in err and "--new" in err, err
    assert snapshot(db) == before  # nothing created, nothing quarantined


def test_history_of_an_unknown_device_is_exit_2(db: Path) -> None:
    code, out, err = _run("--db", str(db), "quarantine", "history", "GPU-nonexistent")
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert "no quarantine history" in err and "GPU-nonexistent is not a device this store has seen" in err, err
    code, out, _ = _run("--db", str(db), "quarantine", "history", "sim:3")  # known: its (possibly empty) table
    assert code == 0 and "sim:3" in out


def test_incidents_command(db: Path) -> None:
    code, out, _ = _run("--db", str(db), "incidents", "--format", "json")
    (inc,) = json.loads(out)
    assert (inc["kind"], inc["step"], inc["device"], inc["suspect_ranks"]) == ("replay", 12, "sim:1", [1])
    code, out, _ = _run("--db", str(db), "incidents")
    assert code == 0 and "local grads differ" in out


def test_merge_is_idempotent(tmp_path: Path, db: Path) -> None:
    other = tmp_path / "node2.db"
    with Store.open(other) as store:
        sid = store.scans.begin(device="sim:7", host="node2", budget_s=10)
        store.scans.record(sid, [result("sim:7")] * 3)  # still running when first merged
    out = tmp_path / "fleet-all.db"
    before = snapshot(db)
    assert _run("merge", str(out), str(db), str(other))[0] == 0
    assert snapshot(db) == before  # inputs are read, never written

    def counts() -> tuple[int, ...]:
        with sqlite3.connect(out) as c:
            return tuple(
                c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in (
                    "devices",
                    "scans",
                    "results",
                    "incidents",
                    "incident_devices",
                    "quarantine_history",
                    "quarantine",
                )
            )

    first = counts()
    # results: one row per device's passing case, plus sim:1's failed execution
    assert first == (4, 4, 5, 1, 1, 1, 1)
    code, text, _ = _run("merge", str(out), str(db), str(other), str(db))
    assert code == 0 and "+0 results" in text
    assert counts() == first
    # The running scan finishes on node2 and more results land: a new merge brings exactly those.
    with Store.open(other) as store:
        store.scans.record(sid, [result("sim:7", passed=False)], finish="complete")
    _run("merge", str(out), str(other))
    with Store.open(out, create=False) as s:
        (sc,) = s.scans.history(device="sim:7")
        assert (sc["status"], sc["executions"], sc["failures"]) == ("complete", 4, 1)
        assert s.quarantine.status("sim:3") == "quarantined"
    # Merging a store into itself is refused.
    assert _run("merge", str(out), str(out))[0] == 2


def test_merge_refuses_bad_inputs_untouched(tmp_path: Path) -> None:
    txt = tmp_path / "x.txt"
    txt.write_text("no\n" * 50)
    before = snapshot(txt)
    code, _, err = _run("merge", str(tmp_path / "out.db"), str(txt))
    assert code == 2 and "not an sdcguard fleet store" in err
    assert snapshot(txt) == before and not (tmp_path / "out.db").exists()
    code, _, err = _run("merge", str(tmp_path / "out.db"), str(tmp_path / "missing.db"))
    assert code == 2 and "does not exist" in err


def test_export_prometheus_parses(db: Path, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    prom = tmp_path / "sdcguard.prom"
    prom.write_text("old content\n")
    code, out, err = _run("--db", str(db), "export", "prometheus", str(prom))
    assert code == 0, err
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert {
        "sdcguard_executions",
        "sdcguard_failures",
        "sdcguard_failure_ratio_upper",
        "sdcguard_device_status",
    } <= set(families)
    ex = {s.labels["UUID"]: s for s in families["sdcguard_executions"].samples}
    assert ex["sim:1"].value == 21 and ex["sim:1"].labels["Hostname"] == "node1" and ex["sim:1"].labels["gpu"] == "1"
    status = {(s.labels["device"], s.labels["status"]): s.value for s in families["sdcguard_device_status"].samples}
    assert status[("sim:3", "quarantined")] == 1 and status[("sim:1", "suspect")] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # the temp file was renamed
    code, _, err = _run("--db", str(db), "export", "prometheus", str(tmp_path / "nope" / "x.prom"))
    assert code == 2 and "does not exist" in err


def test_reading_commands_leave_the_store_untouched(db: Path, tmp_path: Path) -> None:
    before = snapshot(db)
    for args in (
        ["report", "--format", "json"],
        ["report"],
        ["quarantine", "list"],
        ["quarantine", "history"],
        ["incidents"],
        ["export", "prometheus", str(tmp_path / "m.prom")],
    ):
        assert _run("--db", str(db), *args)[0] == 0, args
    assert snapshot(db) == before


def test_table_of_a_large_fleet_lists_what_needs_attention(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    t = NOW_ISH - 600
    with Store.open(path) as store:
        store.scans.record_devices([DeviceInfo(id=f"sim:{i}", host="n", kind="sim") for i in range(60)], now=t)
        scan(store, "sim:7", [result("sim:7", passed=False, t=t)], t=t)
    code, out, _ = _run("--db", str(path), "report")
    # the caption wraps with the table's width: compare its words
    words = " ".join(out.split())
    assert code == 0 and "sim:7" in out and "sim:8 " not in out and "59 healthy devices not listed" in words
    code, out, _ = _run("--db", str(path), "report", "--all")
    assert code == 0 and "sim:8 " in out


def test_gpu_ids_are_accepted_in_any_case(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    upper = "GPU-3F2A1B4C-0000-1111-2222-ABCDEFABCDEF"
    assert _run("--db", str(db), "quarantine", "add", upper, "--reason", "xid 79", "--new")[0] == 0
    (row,) = json.loads(_run("--db", str(db), "quarantine", "list", "--format", "json")[1])
    assert row["device"] == "GPU-" + upper[4:].lower()
    other_case = row["device"].upper().replace("GPU-", "gpu-", 1)
    assert _run("--db", str(db), "quarantine", "release", other_case, "--reason", "ok")[0] == 0
