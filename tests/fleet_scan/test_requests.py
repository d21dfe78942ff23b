"""What crosses into a worker and a retest: the fire drill parsed once, in the parent, and handed over parsed."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from fleet_scan.command import scan
from fleet_scan.device_scan.backend import make_hook
from fleet_scan.device_scan.requests import RetestRequest, WorkerRequest, results_from_json, results_to_json
from fleet_scan.devices.discovery import ScanTarget, discover_cpus
from fleet_scan.options import ScanOptions
from sdcguard.devices import cpu_id
from sdcguard.fleet.store.store import Store
from sdcguard.inject import spec as spec_module
from sdcguard.inject.spec import InjectSpec
from sdcguard.records import CaseResult

CORE = sorted(os.sched_getaffinity(0))[0]


def _target() -> ScanTarget:
    return next(t for t in discover_cpus() if t.index == CORE)


def _refuse(text: str) -> list[object]:
    raise AssertionError(f"parsed {text!r} again")


def test_a_drill_reaches_a_worker_and_a_retest_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    drill = InjectSpec.parse(f"cpu:{CORE}:bitflip,bit=low_mantissa;all:zero,rate=0.5,case=alu.*")
    options = ScanOptions(db="fleet.db", budget_s=2.0, inject=drill)
    worker = WorkerRequest(target=_target(), options=options, references="/dev/shm/refs")
    retest = RetestRequest(target=_target(), options=options, case="alu.u32.chain", n=3, references=None)
    monkeypatch.setattr(spec_module, "parse_inject_spec", _refuse)  # what the processes would have to call
    got_worker = WorkerRequest.from_json(json.loads(json.dumps(worker.to_json())))
    got_retest = RetestRequest.from_json(json.loads(json.dumps(retest.to_json())))
    assert got_worker == worker and got_retest == retest
    assert got_worker.options.inject is not None and got_worker.options.inject.text == drill.text
    # the hook the worker builds corrupts exactly what the parent's spec would
    a = np.arange(64, dtype=np.float32)
    ours, theirs = make_hook(drill, _target()), make_hook(got_worker.options.inject, got_worker.target)
    assert ours is not None and theirs is not None
    assert ours("gemm.fp32.n256", a).tobytes() == theirs("gemm.fp32.n256", a).tobytes() != a.tobytes()


def test_options_hold_a_parsed_drill_never_its_text() -> None:
    with pytest.raises(TypeError, match="InjectSpec"):
        ScanOptions(db="x", inject="cpu:0:zero")
    assert ScanOptions.from_json(ScanOptions(db="x").to_json()) == ScanOptions(db="x")


def test_retest_results_round_trip() -> None:
    results = [
        CaseResult(
            device=cpu_id(0),
            case="alu.u32.chain",
            family="alu",
            seed=3,
            passed=False,
            duration_s=0.01,
            started_at=1.0,
            mismatches=2,
            element=7,
            expected="0x1",
            actual="0x3",
            xor_mask="0x2",
            location="core:0",
            attempt=a,
            detail={"k": [1, 2]},
        )
        for a in (1, 2)
    ]
    assert results_from_json(json.loads(json.dumps(results_to_json(results)))) == results
    with pytest.raises(TypeError):
        results_from_json({"not": "a list"})


_POISON = """
import os
import sdcguard.inject.spec as spec
from sdcguard.fleet.store.store import Store


def _log(what):
    with open({log!r}, "a") as f:
        f.write(f"{{what}} {{os.getpid()}}\\n")


def _refuse(*args, **kwargs):
    raise RuntimeError("a worker or retest parsed the --inject spec")


_open = Store.open.__func__


def _counted_open(cls, *args, **kwargs):
    _log("open")
    return _open(cls, *args, **kwargs)


_log("start")
spec.parse_inject_spec = _refuse
Store.open = classmethod(_counted_open)
"""


@pytest.mark.slow
def test_the_drill_is_parsed_once_and_the_store_opened_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent parses the spec once and opens the store once; every process it starts has a parser that raises
    and a store that counts its openings (a sitecustomize loaded first in each), yet the drill corrupts the worker's
    outputs, the retest reproduces them, and the worker opened the store once, the retest never."""
    site, log = tmp_path / "site", tmp_path / "children.log"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_POISON.format(log=str(log)))
    monkeypatch.setenv("PYTHONPATH", str(site))  # the runner puts the checkout first, then this
    parses: list[str] = []
    real_parse = spec_module.parse_inject_spec

    def counting_parse(text: str) -> list[spec_module.InjectRule]:
        parses.append(text)
        return real_parse(text)

    opens: list[str] = []
    real_open = Store.open.__func__

    def counting_open(cls: type[Store], path: str, **kwargs: Any) -> Store:
        opens.append(str(path))
        return real_open(cls, path, **kwargs)

    monkeypatch.setattr(spec_module, "parse_inject_spec", counting_parse)
    monkeypatch.setattr(Store, "open", classmethod(counting_open))
    db = tmp_path / "fleet.db"
    args = ["--db", str(db), "--all", "--json", "--budget", "1.5", "--retests", "1", "--device", f"cpu:{CORE}"]
    args += ["--lock-dir", str(tmp_path / "locks"), "--inject", f"cpu:{CORE}:bitflip,rate=1.0"]
    result = CliRunner().invoke(scan, args)
    assert result.exit_code == 1, result.output
    drills = tmp_path / "fleet.drills.db"  # a drill's results go to the drill store beside --db, never --db
    assert parses == [f"cpu:{CORE}:bitflip,rate=1.0"] and opens == [str(drills)]
    assert not db.exists()
    children = [line.split() for line in log.read_text().splitlines()]
    started = {pid for what, pid in children if what == "start"}
    assert len(started) >= 2 and str(os.getpid()) not in started, "the worker and its retest loaded the poison"
    assert [what for what, _ in children].count("open") == 1, "the worker opened the store once, a retest never"
    with sqlite3.connect(drills) as conn:
        sticky = conn.execute("SELECT COUNT(*) FROM results WHERE passed = 0 AND attempt = 0 AND sticky = 1").fetchone()
        retests = conn.execute("SELECT COUNT(*) FROM results WHERE passed = 0 AND attempt > 0").fetchone()
        (meta,) = conn.execute("SELECT meta FROM scans").fetchone()
    assert sticky[0] >= 1 and retests[0] >= 1, "the retest got the drill and reproduced the failure"
    assert json.loads(meta)["inject"] == f"cpu:{CORE}:bitflip,rate=1.0"
