"""Every command that takes a device id refuses one the store has never seen, in one line with exit 2 and the
closest known ids (a typo is the usual cause), instead of an empty answer that looks like "nothing wrong"."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sdcguard.cli import cli
from sdcguard.fleet.store.store import Store
from tests._fleet import clean, scan


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--device", "cpu:vm:9"],
        ["incidents", "--device", "cpu:vm:9"],
        ["quarantine", "add", "cpu:vm:9", "--reason", "typo"],
        ["quarantine", "release", "cpu:vm:9", "--reason", "typo"],
        ["quarantine", "history", "cpu:vm:9"],
    ],
)
def test_an_unknown_device_is_one_line_exit_2(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "fleet.db"
    with Store.open(db) as s:
        scan(s, "cpu:vm:1", clean("cpu:vm:1", 5))
    result = CliRunner().invoke(cli, ["--db", str(db), *args])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.count("\n") == 0 and "cpu:vm:9" in line and "did you mean cpu:vm:1" in line, line
