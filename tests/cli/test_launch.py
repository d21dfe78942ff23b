"""``sdcguard launch -- CMD``: the exit-code contract through a launcher that reports any failed worker as exit 1
(torchrun), from the verdicts the ranks write; torchrun's traceback of such an exit held back, anything else passed
through. The real torchrun run is tests/training/recovery/test_torchrun.py."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from sdcguard.cli.training.launch import TracebackFilter
from sdcguard.contract import Verdict, contract_status

TORCHRUN_TAIL = """Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
  exitcode  : 86 (pid: 11236)
============================================================
"""


def _rank(verdict: str | None, status: int, stderr: str = "") -> str:
    """A stand-in for a launcher: writes a verdict (JSON) when given, prints ``stderr`` and exits ``status``."""
    lines = ["import os, sys"]
    if verdict is not None:
        lines.append(f"open(os.environ['SDCGUARD_VERDICT_FILE'], 'a').write({verdict!r} + '\\n')")
    lines += [f"sys.stderr.write({stderr!r})", f"sys.exit({status})"]
    return "; ".join(lines)


def _launch(code: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sdcguard", "launch", *extra, "--", sys.executable, "-c", code], capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


def test_a_contract_exit_through_a_launcher_exits_86_in_one_line_without_its_traceback(tmp_path: Path) -> None:
    verdict = Verdict(status=86, message="sdcguard: exit 86: recovery at step 4").to_json()
    done = _launch(_rank(verdict, 1, "worker says hi\n" + TORCHRUN_TAIL), "--verdict-file", str(tmp_path / "v"))
    assert done.returncode == 86
    assert "worker says hi" in done.stderr  # the rest passes through
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "sdcguard launch: exit 86; a rank said: sdcguard: exit 86: recovery at step 4"
    )


def test_without_a_verdict_the_launchers_status_and_output_pass_through_unchanged() -> None:
    done = _launch(_rank(None, 1, TORCHRUN_TAIL))
    assert done.returncode == 1
    assert done.stderr == TORCHRUN_TAIL


def test_a_leaver_whose_job_went_on_still_drains_its_node() -> None:
    verdict = Verdict(status=86, message="sdcguard: exit 86: left", left=True).to_json()
    done = _launch(_rank(verdict, 0))
    assert done.returncode == 86
    assert "(the job went on without it)" in done.stderr


def test_a_command_that_cannot_run_is_one_line_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sdcguard", "launch", "--", "/nonexistent/torchrun"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot run /nonexistent/torchrun" in done.stderr


def test_a_traceback_that_is_not_torchruns_passes_through_as_it_comes() -> None:
    out = io.BytesIO()
    sink = TracebackFilter(out)
    for line in [b"Traceback (most recent call last):\n", b'  File "x.py"\n', b"ValueError: boom\n", b"after\n"]:
        sink.feed(line)
    assert out.getvalue().endswith(b"ValueError: boom\nafter\n") and sink.held() == []


def test_the_status_the_ranks_verdicts_give() -> None:
    v = lambda s: Verdict(status=s, message="")  # noqa: E731
    assert contract_status([], 3) == 3
    assert contract_status([v(85), v(85)], 1) == 85
    assert contract_status([v(85), v(86)], 1) == 86
