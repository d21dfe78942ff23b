from __future__ import annotations

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
