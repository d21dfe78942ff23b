"""``sdcguard import dcgm``: a ``dcgmi diag -j`` output recorded per GPU beside the golden suite's results, shown by
``report``, merged like the rest of a node's store, and refused in one line (nothing written) when it is foreign or
names a GPU the store cannot place. On SQLite and on the PostgreSQL server the tests start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.store.store import Store
from sdcguard.records import DeviceInfo
from tests._fleet import result, scan

DATA = Path(__file__).parent / "data" / "dcgm"
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def _gpus(store: Store, host: str = "node7") -> None:
    store.scans.record_devices(
        [DeviceInfo(id=g, host=host, kind="gpu", model="H200", index=i) for i, g in enumerate((GPU0, GPU1))], now=1e9
    )
    for g in (GPU0, GPU1):
        scan(store, g, [result(g)], host=host)


def _run(db: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["--db", db, *args])
    return r.exit_code, r.output


def test_a_failing_level3_diagnostic_shows_beside_the_golden_result(store_db: str, tmp_path: Path) -> None:
    db = store_db
    with Store.open(db) as store:
        _gpus(store)
    code, out = _run(db, "import", "dcgm", str(DATA / "level3-4x-memory-fail.json"), "--host", "node7")
    assert code == 0 and f"failed: {GPU1} memory" in out, out
    code, out = _run(db, "import", "dcgm", str(DATA / "level3-4x-memory-fail.json"), "--host", "node7")
    assert code == 0 and ", 0 new" in out, out  # the same run twice: nothing written again
    code, out = _run(db, "report", "--format", "json", "--since", "all")
    rows = {r["device"]: r for r in json.loads(out)}
    assert rows[GPU1]["dcgm"] == "fail: memory" and rows[GPU0]["dcgm"] == "warn", rows  # (a warning on GPU 0)
    assert rows[GPU1]["failures"] == 0 and rows[GPU1]["executions"] == 1  # a second opinion moves no golden rate
    code, out = _run(db, "report", "--since", "all")
    assert code == 0 and "dcgm diag" in out and "fail: memory" in out, out
    page = tmp_path / "report.html"
    code, out = _run(db, "report", "--since", "all", "--html", str(page))
    assert code == 0 and "<th" in page.read_text() and "fail: memory" in page.read_text(), out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--host", "node9"], "names GPU 0 on node9, which the store does not know"),
        (["--host", "node7", "--gpu", "x=GPU-1"], "use INDEX=DEVICE"),
    ],
)
def test_a_gpu_it_cannot_place_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], words: str) -> None:
    db = str(tmp_path / "f.db")
    with Store.open(db) as store:
        _gpus(store)
    code, out = _run(db, "import", "dcgm", str(DATA / "level3-4x-memory-fail.json"), *args)
    assert code == 2 and words in out and len(out.strip().splitlines()) == 1, out
    with Store.open(db) as store:
        assert store.diagnostics.latest() == {}


@pytest.mark.parametrize(
    "text, words", [("[1, 2]", "not an object"), ("{", "invalid JSON"), ('{"x": 1}', "no 'DCGM Diagnostic'")]
)
def test_foreign_json_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    db, bad = str(tmp_path / "f.db"), tmp_path / "bad.json"
    bad.write_text(text)
    code, out = _run(db, "import", "dcgm", str(bad), "--gpu", f"0={GPU0}")
    assert code == 2 and words in out and len(out.strip().splitlines()) == 1, out


def test_named_gpus_and_a_merge_carry_the_diagnostic(tmp_path: Path) -> None:
    node, fleet = tmp_path / "node.db", tmp_path / "fleet.db"
    args = ["--host", "elsewhere", "--gpu", f"0={GPU0}", "--gpu", f"1={GPU1}"]
    code, out = _run(str(node), "import", "dcgm", str(DATA / "level1-3x.json"), *args)
    assert code == 0, out
    merge_stores(fleet, [node])
    merge_stores(fleet, [node])  # merged twice: once
    with Store.open(node) as a, Store.open(fleet) as b:
        assert a.diagnostics.latest() == b.diagnostics.latest() != {}


def test_a_failed_diagnostic_quarantines_only_where_the_policy_says_so(tmp_path: Path) -> None:
    from sdcguard.fleet.policy import QuarantinePolicy, apply_policy

    db = str(tmp_path / "f.db")
    with Store.open(db) as store:
        _gpus(store)
    code, out = _run(db, "import", "dcgm", str(DATA / "level3-4x-memory-fail.json"), "--host", "node7")
    assert code == 0, out
    with Store.open(db) as store:
        t = store.diagnostics.latest()[GPU1].time
        assert apply_policy(store, QuarantinePolicy(), now=t + 60).quarantined == []  # off by default
        decided = apply_policy(store, QuarantinePolicy(dcgm_failures=True), now=t + 60)
        assert decided.quarantined == [GPU1] and "DCGM diagnostic failed: memory" in decided.reasons[0]
        store.quarantine.release(GPU1, reason="reseated", now=t + 120)  # a release ends that evidence
        assert apply_policy(store, QuarantinePolicy(dcgm_failures=True), now=t + 180).quarantined == []
