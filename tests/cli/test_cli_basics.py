from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from sdcguard.cli import cli


def _walk(group: click.Group, ctx: click.Context, prefix: list[str]) -> list[list[str]]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out.append([*prefix, name])
        if isinstance(cmd, click.Group):
            out.extend(_walk(cmd, ctx, [*prefix, name]))
    return out


def test_every_command_has_help() -> None:
    ctx = click.Context(cli)
    for path in [[], *_walk(cli, ctx, [])]:
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output


def test_unknown_command_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "frobnicate" in result.output


def test_the_command_freezes_its_imports_only_in_a_process_of_its_own(tmp_path: Path) -> None:
    """``sdcguard`` as a command moves what its imports made out of the collector's sight (gc.freeze); run inside a
    caller's process (click's runner, a test) it leaves that process's collector alone."""
    import gc

    from sdcguard.fleet.store.store import Store

    Store.open(tmp_path / "f.db").close()  # an empty store
    before = gc.get_freeze_count()
    assert CliRunner().invoke(cli, ["--db", str(tmp_path / "f.db"), "report", "--format", "json"]).exit_code == 0
    assert gc.get_freeze_count() == before
    probe = (
        "import gc, sys; from sdcguard.cli import main; sys.argv = ['sdcguard', '--db', sys.argv[1], 'report', "
        "'--format', 'json']\ntry:\n    main()\nfinally:\n    print(gc.get_freeze_count() > 0, file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "f.db")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "True"
