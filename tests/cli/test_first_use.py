"""What a new user tripped on in the first fifteen minutes (issue 35), each as the user met it: the install hints
name this project's distribution, ``sdcguard scrub`` works on the scan-node install or says why not and never
hides a corrupt checkpoint behind a store problem, ``--db`` after a command is explained, the report's words
(hosts, CSV booleans, a breaker drill's devices), the policy's failed actions, a near id on ``quarantine release``,
and ``make run`` with its own scan options."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.actions import ActionTemplate
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, clean, result, scan

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path, without: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[int, str]:
    """``sdcguard ARGS`` in a fresh interpreter in ``cwd``, the modules in ``without`` made unimportable (the
    scan-node install has no torch and no matplotlib); returns the exit code and stderr."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {list(without)!r}:
            sys.modules[name] = None
        sys.argv = ["sdcguard", *{list(args)!r}]
        from sdcguard.cli import main
        main()
        """
    )
    environ = {k: v for k, v in os.environ.items() if k != "SDCGUARD_DB"}
    environ.update({"PYTHONPATH": str(ROOT), **(env or {})})
    p = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], cwd=cwd, capture_output=True, text=True, env=environ, timeout=120
    )
    return p.returncode, p.stderr


def _store(path: Path) -> Path:
    with Store.open(path) as store:
        scan(store, "sim:1", clean("sim:1", 5, t=NOW - 60), host="node1", t=NOW - 60)
    return path


# --------------------------------------------------------------------------------------------- install hints


def test_report_plot_on_the_light_install_names_our_distribution(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.db")
    code, err = _cli(
        "--db", str(db), "report", "--plot", str(tmp_path / "p.png"), cwd=tmp_path, without=("matplotlib",)
    )
    assert code == 2
    assert err.strip().splitlines() == [
        "sdcguard: error: --plot needs matplotlib, which is not installed here: pip install 'sdcguard-fleet[plot]'"
    ]
    help_text = CliRunner().invoke(cli, ["report", "--help"]).stdout
    # (click may wrap the help at the hyphen)
    assert "sdcguard-fleet[plot]" in "".join(help_text.split()) and "sdcguard[plot]" not in help_text


def test_scrub_without_torch_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    code, err = _cli("scrub", str(tmp_path / "ckpt"), cwd=tmp_path, without=("torch",))
    assert code == 2
    assert err.strip().splitlines() == [
        "sdcguard: error: sdcguard scrub needs torch, which is not installed here: pip install 'sdcguard-fleet[torch]'"
    ]
    assert not (tmp_path / "sdcguard.db").exists()


# --------------------------------------------------------------------------------------------------- scrub


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A clean checkpoint and a copy with one flipped bit in its data file."""
    torch = pytest.importorskip("torch", reason="saving a checkpoint needs torch")
    from sdcguard import checkpoint

    root = tmp_path_factory.mktemp("ckpts")
    clean_dir, bad_dir = root / "clean", root / "bad"
    with pytest.warns(UserWarning, match="single process"):  # DCP's own note about saving without a group
        checkpoint.save({"w": torch.arange(4096, dtype=torch.float32)}, checkpoint_id=str(clean_dir))
    shutil.copytree(clean_dir, bad_dir)
    data = next(bad_dir.glob("*.distcp"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))
    return {"clean": clean_dir, "bad": bad_dir}


def test_scrub_creates_no_store_nobody_asked_for_and_says_so(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    code, err = _cli("scrub", str(checkpoints["clean"]), cwd=tmp_path)
    assert code == 0, err
    assert not (tmp_path / "sdcguard.db").exists()
    assert "not recorded" in err and "--db" in err
    # an existing ./sdcguard.db, or one named, takes the verdicts
    code, err = _cli("--db", str(tmp_path / "named.db"), "scrub", str(checkpoints["clean"]), cwd=tmp_path)
    assert code == 0 and "not recorded" not in err, err
    with Store.open(tmp_path / "named.db", readonly=True) as store:
        assert [s.status for s in store.training.scrubs()] == ["clean"]


def test_scrub_prints_no_torch_deprecation_warning(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    code, err = _cli("scrub", "--no-record", str(checkpoints["clean"]), cwd=tmp_path)
    assert code == 0
    assert "Warning" not in err and "deprecated" not in err, err


def test_a_corrupt_checkpoint_exits_1_even_when_the_store_cannot_take_the_record(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    code, err = _cli("--db", str(tmp_path / "missing" / "x.db"), "scrub", str(checkpoints["bad"]), cwd=tmp_path)
    assert code == 1, err  # cron alerts on 1: a store problem must not turn "corrupt" into "could not run"
    assert "not recorded" in err and "missing" in err
    code, err = _cli("--db", str(tmp_path / "missing" / "x.db"), "scrub", str(checkpoints["clean"]), cwd=tmp_path)
    assert code == 2 and "not recorded" in err  # clean, but the record asked for was not written


# --------------------------------------------------------------------------------------------- command line


@pytest.mark.parametrize("args", [["report", "--db", "x.db"], ["quarantine", "list", "--db=x.db"]])
def test_db_after_the_command_says_where_it_goes(args: list[str]) -> None:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    command = " ".join(a for a in args if not a.startswith("--") and a != "x.db")
    assert f"put it before the command (sdcguard --db FILE {command})" in line


def test_release_of_a_mistyped_id_suggests_the_near_one(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.db")
    with Store.open(db) as store:
        store.quarantine.add("sim:1", reason="MCE", by="ops")
    r = CliRunner().invoke(cli, ["--db", str(db), "quarantine", "release", "sim:11", "--reason", "fixed"])
    assert r.exit_code == 2
    assert "did you mean sim:1?" in r.stderr and "sim:11 is not a device this store has seen" in r.stderr


# ------------------------------------------------------------------------------------------------- the report


def test_the_html_page_counts_one_host_in_the_singular(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.db")
    page = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["--db", str(db), "report", "--html", str(page)])
    assert r.exit_code == 0, r.output
    text = page.read_text()
    assert "1 device on 1 host;" in text and "1 hosts" not in text and "1 devices" not in text
    assert "1 device, window" in r.stdout


def test_csv_booleans_are_spelled_as_in_json(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.db")
    out = CliRunner().invoke(cli, ["--db", str(db), "report", "--format", "csv"]).stdout
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert row["slow"] == "false"
    assert "True" not in out and "False" not in out


def test_devices_whose_failures_the_breaker_blames_on_the_suite_are_not_suspect(tmp_path: Path) -> None:
    """The breaker drill: every device gives the same wrong output for one case (a bad golden file); the policy
    blames the suite and quarantines nobody, and the report must not call the devices suspect for it."""
    db = tmp_path / "s.db"
    t = NOW - 600
    with Store.open(db) as store:
        for n in (1, 2, 3):
            dev = f"sim:{n}"
            wrong = result(dev, passed=False, case="alu.u32.chain", digest="ab" * 32, t=t + 5)
            scan(store, dev, [*clean(dev, 5, t=t), wrong], host=f"node{n}", t=t)
        scan(store, "sim:4", [result("sim:4", passed=False, case="gemm.fp32.n64", t=t + 7)], host="node4", t=t)
        outcome = apply_policy(store, QuarantinePolicy(), now=NOW)
    assert outcome.breaker_tripped and not outcome.quarantined
    rows = {r["device"]: r for r in json.loads(_report_json(db))}
    assert {d: r["status"] for d, r in rows.items()} == {
        "sim:1": "healthy",
        "sim:2": "healthy",
        "sim:3": "healthy",
        "sim:4": "suspect",  # its own wrong output: evidence against it
    }
    assert rows["sim:1"]["failures"] == 1  # the failure still counts in the rate


def _report_json(db: Path) -> str:
    r = CliRunner().invoke(cli, ["--db", str(db), "report", "--format", "json", "--since", "all"])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_an_action_that_never_ran_says_why_without_a_none(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with Store.open(db) as store:
        scan(store, "sim:1", [result("sim:1", passed=False, sticky=True)], t=NOW - 60)
        scan(store, "sim:1", [result("sim:1", passed=False, attempt=1, sticky=True)], t=NOW - 50)
        missing = ActionTemplate.from_text("/nonexistent/drain {device}")
        apply_policy(store, QuarantinePolicy(), now=NOW, actions=[missing])
        reasons = [d.reason for d in store.quarantine.decisions() if d.decision == "action_failed"]
    assert reasons and all("None" not in r and "cannot run" in r for r in reasons), reasons


# ------------------------------------------------------------------------------------------------- make run


def _fake_venv(tmp_path: Path, scan_exit: int) -> Path:
    """A virtualenv whose ``sdcguard`` logs its arguments and exits as told (``make run`` without installing)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls"
    tool = venv / "bin" / "sdcguard"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" = scan ] && exit {scan_exit}\nexit 0\n')
    tool.chmod(0o755)
    (venv / ".sdcguard-installed").touch()
    os.utime(venv / ".sdcguard-installed", (4e9, 4e9))  # newer than pyproject.toml: make installs nothing
    return venv


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_keeps_all_with_its_own_scan_args_and_shows_no_stale_report(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, scan_exit=0)
    p = subprocess.run(
        ["make", "-s", "run", f"RUN_VENV={venv}", "RUN_SCAN_ARGS=--budget 30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["scan --all --budget 30", "report"]
    venv = _fake_venv(tmp_path / "again", scan_exit=2)
    p = subprocess.run(["make", "-s", "run", f"RUN_VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert (tmp_path / "again" / "calls").read_text().splitlines() == ["scan --all --budget 10"]
    assert "no report: the scan could not run" in p.stderr
