"""``sdcguard golden generate|verify``: write and check the golden data (``golden_vectors/``)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["golden"]

_DIR = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Golden-data directory (default: the packaged golden_vectors/).",
)


@click.group()
def golden() -> None:
    """Golden vectors: the known-answer data the scanner compares against.

    \b
    Example:
        sdcguard golden verify
        sdcguard golden generate --dir /tmp/golden && sdcguard golden verify --dir /tmp/golden
    """


@golden.command()
@_DIR
def generate(directory: Path | None) -> None:
    """Compute every golden output with exact reference arithmetic (numpy integer and float64 math, never the
    device under test) and write it with its manifest. Deterministic: regenerating gives identical bytes.

    \b
    Example:
        sdcguard golden generate --dir golden_vectors
    """
    from ..golden.suite import generate as _generate

    written = _generate(directory)
    click.echo(f"wrote {len(written)} files to {written[-1].parent}")


@golden.command()
@_DIR
def verify(directory: Path | None) -> None:
    """Re-check the golden data: every file's sha256, the manifest, and every output recomputed by the reference
    arithmetic. Exits 2 naming the first file that does not match.

    \b
    Example:
        sdcguard golden verify --dir golden_vectors
    """
    from ..golden.suite import verify as _verify

    report = _verify(directory)
    click.echo(f"golden data OK: {report.cases} cases, {report.files} files in {report.directory}")
