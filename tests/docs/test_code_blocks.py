"""Every code block of the README and of docs/ runs, or is an excerpt of a file the tests run or ship, or is the
output of an example the tests run (checked in tests/examples), or is a figure from a recorded run, or is a shell
block whose every command exists as written. (Issue 35: 9 of the README's 10 Python blocks failed when copied.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import click
import pytest

from sdcguard.cli import cli
from tests.docs.blocks import PAGES, ROOT, Block, all_blocks, blocks

BLOCKS = all_blocks()


def test_every_block_says_what_it_is() -> None:
    unknown = [b.where for b in BLOCKS if b.mark is None and b.lang not in ("python", "sh")]
    assert unknown == [], "a block must be python, sh, or marked as an excerpt or output: " + ", ".join(unknown)
    assert any(b.lang == "python" and b.mark is None for b in BLOCKS)


def _contiguous(needle: list[str], hay: list[str]) -> bool:
    n = len(needle)
    return any(hay[i : i + n] == needle for i in range(len(hay) - n + 1))


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark == "excerpt"], ids=lambda b: b.where)
def test_an_excerpt_is_a_contiguous_run_of_its_file(block: Block) -> None:
    source = ROOT / str(block.target)
    assert source.is_file(), f"{block.where}: {block.target} does not exist"
    lines = block.text.splitlines()
    snippet = [line for line in lines if line.strip().startswith("--8<--")]
    if snippet:  # pymdownx.snippets includes the file itself at build time (check_paths: a missing one fails)
        assert all(str(block.target) in line for line in snippet), block.where
        return
    assert _contiguous(lines, source.read_text().splitlines()), f"{block.where}: not an excerpt of {block.target}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark == "recorded output"], ids=lambda b: b.where)
def test_a_recorded_output_names_a_script_that_exists(block: Block) -> None:
    words = shlex.split(str(block.target))
    assert words[0] == "python" and (ROOT / words[1]).is_file(), block.where


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark == "output of"], ids=lambda b: b.where)
def test_an_output_names_an_example(block: Block) -> None:
    assert (ROOT / str(block.target)).is_file() and str(block.target).startswith("examples/"), block.where


# ----------------------------------------------------------------------------------------------- python blocks

_RUNNER = textwrap.dedent(
    """
    import json, sys, traceback, warnings
    warnings.simplefilter("ignore")  # what a block prints is its own business; it must not raise
    failures = []
    for where, code in json.load(sys.stdin):
        try:
            exec(compile(code, where, "exec"), {"__name__": "__main__"})
        except BaseException:
            failures.append(where + "\\n" + traceback.format_exc(limit=-3))
    print(json.dumps(failures))
    """
)


def _demo_store(path: Path) -> None:
    """The ``fleet.db`` a page's blocks may open: three simulated devices scanned an hour ago, one failure, one
    device quarantined, one training incident."""
    from sdcguard.fleet.store.store import Store
    from sdcguard.records import Incident
    from tests._fleet import clean, result, scan

    t = __import__("time").time() - 3600
    with Store.open(path) as store:
        for n in (1, 2, 3):
            dev = f"sim:{n}"
            scan(store, dev, [*clean(dev, 5, t=t), *([result(dev, passed=False, t=t + 9)] if n == 2 else [])], t=t)
        store.quarantine.add("sim:2", reason="sticky failure", by="policy")
        store.training.record_incident(
            Incident(kind="replay", step=7, suspect_ranks=(1,), device="sim:2", detail="grads differ", time=t)
        )


def _python_pages() -> list[Path]:
    return [p for p in PAGES if any(b.lang == "python" and b.mark is None for b in blocks(p))]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("page", _python_pages(), ids=lambda p: p.name)
def test_the_python_blocks_of_a_page_run_as_written(page: Path, tmp_path: Path) -> None:
    """Each block in a fresh namespace (a block stands alone, as a reader copies it), one process per page, in a
    directory holding only a small fleet store, ``fleet.db``; one intra-op thread, as the other tests' processes."""
    code = [(b.where, b.text) for b in blocks(page) if b.lang == "python" and b.mark is None]
    _demo_store(tmp_path / "fleet.db")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("SDCGUARD_DB", None)
    p = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(code),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=220,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    failures = json.loads(p.stdout.strip().splitlines()[-1])
    assert failures == [], "\n\n".join(failures)


# --------------------------------------------------------------------------------------------------- sh blocks


def _commands(text: str) -> list[str]:
    """The command lines of a shell block: continuation lines and lines inside an open quote joined, comments
    dropped."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if not pending and (raw.lstrip().startswith("#") or not raw.strip()):
            continue
        line = raw if pending and not _closed(pending) else raw.split(" #", 1)[0].rstrip()
        joined = (pending + " " + line.strip()) if pending else line.strip()
        if joined.endswith("\\"):
            pending = joined[:-1].rstrip()
            continue
        if not _closed(joined):
            pending = joined
            continue
        out.append(joined)
        pending = ""
    return [c for c in out + ([pending] if pending else []) if c]


def _closed(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:  # "No closing quotation": the quoted text goes on on the next line
        return False
    return True


def _parses(argv: list[str]) -> None:
    """Parse ``sdcguard ARGV`` with the real command line, down to the leaf command, without running it."""
    ctx = cli.make_context("sdcguard", list(argv))
    command: click.Command = cli
    while isinstance(command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        name, sub, args = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, args, parent=ctx)
        command = sub


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _launch_lines() -> set[str]:
    from tests.examples.test_examples import EXAMPLES, launch_command

    return {launch_command(p) for p in EXAMPLES}


def check_command(command: str) -> None:
    words = shlex.split(command)
    head = words[0]
    if head == "sdcguard":
        _parses(words[1:])
    elif head == "make":
        assert {w for w in words[1:] if "=" not in w} <= _make_targets(), command
    elif head in ("python", "python3", "bash") or head.startswith(("scripts/", "deploy/", "examples/")):
        script = words[1] if head in ("python", "python3", "bash") else head
        if head.startswith("python") and script == "-m":
            return
        assert (ROOT / script).exists(), f"{script} does not exist ({command})"
    elif head == "torchrun":
        assert command in _launch_lines(), f"not an example's launch line: {command}"
    elif head in ("pip", "export"):
        return  # tests/test_distribution.py checks every pip line of the docs
    elif head in OTHER_PROGRAMS:
        return  # another program's command line (the store's SQLite tools): not ours to parse
    elif head == "docker":  # an image of the Dockerfile: its target is a stage, its tag the version
        stages = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
        assert words[1] == "build" and words[words.index("--target") + 1] in stages, command
        version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        assert words[words.index("-t") + 1].endswith(f":{version}"), command
    else:
        raise AssertionError(f"an sh block runs {head!r}, which the docs test cannot check: {command}")


OTHER_PROGRAMS = {"sqlite3", "sqlite-utils", "datasette", "psql"}
"""Programs whose commands the docs show (reading the store with SQLite's own tools) and this test does not check."""

SH = [b for b in BLOCKS if b.lang == "sh" and b.mark is None]


@pytest.mark.parametrize("block", SH, ids=lambda b: b.where)
def test_every_command_of_a_shell_block_exists_as_written(block: Block) -> None:
    for command in _commands(block.text):
        try:
            check_command(command)
        except click.ClickException as e:
            raise AssertionError(f"{block.where}: {command}: {e.format_message()}") from None


def test_the_checker_catches_a_stale_option_and_a_missing_file() -> None:
    with pytest.raises(click.ClickException):
        check_command("sdcguard report --no-such-option")
    with pytest.raises(click.ClickException):
        check_command("sdcguard quarantine add cpu:1")  # --reason is required
    with pytest.raises(AssertionError):
        check_command("python benchmarks/no_such_benchmark.py")
    with pytest.raises(AssertionError):
        check_command("make no-such-target")
    check_command("sdcguard --db fleet.db report --since 7d --format json")
